"""Weight sync: the trainer's full state dict reaches every rollout engine without passing the driver.

Rank 0 gathers the policy into one object-store copy; every rollout worker
reads that copy. Engines refuse new weights while a request is in flight, so
no response ever mixes two versions.

Colocated on GPUs the engines sleep while the trainer runs (`offload_rollout`,
vLLM's level-2 sleep, which discards their weights): the sync loads the new
weights into them and then wakes them (KV cache back), so after `push_weights`
every engine serves the new version. For awake engines, and for the native
engine (which never sleeps), the wake is a no-op. Nothing calls
`offload_rollout` yet (config.GPU_MISSING).
"""
from __future__ import annotations

from tailflow.engines.cluster.rollout_group import RolloutGroup
from tailflow.engines.cluster.trainer_group import TrainerGroup


def offload_rollout(rollout: RolloutGroup) -> None:
    """Before training on shared GPUs: the rollout engines give their GPU memory to the trainer ranks."""
    rollout.sleep()


def push_weights(trainer: TrainerGroup, rollout: RolloutGroup, version: int) -> None:
    rollout.load_weights_ref(trainer.state_dict_ref(), version)
    rollout.wake_up()
