"""Weight sync: the trainer's full state dict reaches every rollout engine without passing the driver.

Rank 0 gathers the policy into one object-store copy; every rollout worker
reads that copy. Engines refuse new weights while a request is in flight, so
no response ever mixes two versions.

Colocated on GPUs with a synchronous step the phases take turns on each GPU
(`placement.takes_turns`; the whole sequence: docs/gpu.md, "turns"): here the
trainer parks (`TrainerGroup.park`) before the engines load the new weights
and wake, and a critic (train.advantage gae), seated on the same GPUs, moves
to host memory too. Without turns the wake is a no-op for awake engines.
"""
from __future__ import annotations

from tailflow.engines.cluster.rollout_group import RolloutGroup
from tailflow.engines.cluster.trainer_group import TrainerGroup


def push_weights(trainer: TrainerGroup, rollout: RolloutGroup, version: int, take_turns: bool = False,
                 critic: TrainerGroup | None = None) -> None:
    """Every engine serves `version` afterwards, awake. `take_turns`: the trainer (and `critic`) leave the GPU
    first."""
    if take_turns and critic is not None:
        critic.offload()
    weights = trainer.park() if take_turns else trainer.state_dict_ref()
    rollout.load_weights_ref(weights, version)
    rollout.wake_up()
