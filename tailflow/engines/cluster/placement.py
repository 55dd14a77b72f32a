"""Where the actors go: rollout and training on shared devices (colocated) or on their own (disaggregated).

Colocated (the default): a rollout worker and a trainer rank share a device.
Each asks Ray for half of one (CPU or GPU), so a node with N devices holds N
of each; the phases of a synchronous step take turns. On GPUs the rollout
engine would free its weights and KV cache while the trainer runs and get
them back at weight sync; the native CPU engine keeps them (host memory is
not the constraint here). Disaggregated: every actor has a whole device, so
rollout and training never contend, at twice the devices.

`check_fits` compares what the actors ask for with what the Ray cluster has,
before any actor starts, and names the numbers when it cannot fit; otherwise
Ray would leave the actors pending forever. The GPU mapping is kept for the
GPU work to come, but no run reaches it: config validation refuses
`cluster.device: gpu` (config.GPU_MISSING says what is missing), so only
`placement_for` called directly exercises it.
"""
from __future__ import annotations

from dataclasses import dataclass

from tailflow.config import ConfigError, RunConfig


@dataclass(frozen=True)
class ActorResources:
    num_cpus: float
    num_gpus: float


@dataclass(frozen=True)
class Placement:
    rollout: ActorResources
    trainer: ActorResources
    num_rollout: int
    num_trainer: int

    def needs(self) -> dict[str, float]:
        total = {"CPU": self.rollout.num_cpus * self.num_rollout + self.trainer.num_cpus * self.num_trainer,
                 "GPU": self.rollout.num_gpus * self.num_rollout + self.trainer.num_gpus * self.num_trainer}
        return {name: amount for name, amount in total.items() if amount > 0}


def placement_of(config: RunConfig) -> Placement:
    return placement_for(config.cluster.device, config.cluster.placement, config.rollout.num_workers,
                         config.train.num_workers)


def placement_for(device: str, placement: str, num_rollout: int, num_trainer: int) -> Placement:
    """Each actor's ask: half a device colocated, a whole one disaggregated (a GPU actor also takes one CPU)."""
    share = 0.5 if placement == "colocated" else 1.0
    if device == "gpu":
        one = ActorResources(num_cpus=1, num_gpus=share)
    else:
        one = ActorResources(num_cpus=share, num_gpus=0)
    return Placement(rollout=one, trainer=one, num_rollout=num_rollout, num_trainer=num_trainer)


def check_fits(placement: Placement, available: dict[str, float], placement_name: str) -> None:
    short = {name: (need, available.get(name, 0.0)) for name, need in placement.needs().items()
             if available.get(name, 0.0) + 1e-9 < need}
    if short:
        wanted = ", ".join(f"{need:g} {name} (the cluster has {have:g})" for name, (need, have) in short.items())
        raise ConfigError(
            f"cluster: {placement_name} placement of {placement.num_rollout} rollout workers and "
            f"{placement.num_trainer} trainer ranks needs {wanted}; lower rollout.num_workers or "
            f"train.num_workers, use cluster.placement: colocated, or add nodes")


def check_cluster_fits(config: RunConfig) -> Placement:
    """The run's placement, checked against the Ray cluster this process is attached to."""
    import ray

    placement = placement_of(config)
    check_fits(placement, ray.cluster_resources(), config.cluster.placement)
    return placement
