"""Weight sync: the trainer's full state dict reaches every rollout engine without passing the driver.

Rank 0 gathers the policy into one object-store copy; every rollout worker
reads that copy. Engines refuse new weights while a request is in flight, so
no response ever mixes two versions.
"""
from __future__ import annotations

from tailflow.engines.cluster.rollout_group import RolloutGroup
from tailflow.engines.cluster.trainer_group import TrainerGroup


def push_weights(trainer: TrainerGroup, rollout: RolloutGroup, version: int) -> None:
    rollout.load_weights_ref(trainer.state_dict_ref(), version)
