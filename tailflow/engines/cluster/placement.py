"""Where the actors go: rollout and training on shared devices (colocated) or on their own (disaggregated).

Colocated (the default): a rollout worker and a trainer rank share a device;
the phases of a synchronous step take turns. Disaggregated: every actor has a
whole device, so rollout and training never contend, at twice the devices.

On CPUs each actor asks Ray for half a CPU (colocated) or one (disaggregated).
On GPUs fractional asks alone would let Ray put two trainer ranks on one GPU,
so `gpu_layout` reserves Ray placement-group bundles of one GPU each:
colocated, bundle i holds trainer rank i and rollout worker i (each asks half
of the bundle's GPU, so both see the same device; where the phases take turns
the engines sleep while the trainer runs and the trainer parks while they roll
out: `takes_turns`, `weight_sync.py`);
disaggregated, trainer ranks and rollout workers get bundles of their own, in
two groups. Bundles are PACKed unless `cluster.spread_trainer_ranks` asks for
one node per trainer rank (STRICT_SPREAD).

`check_fits` compares what the actors ask for with what the Ray cluster has,
before any actor starts, and names the numbers when it cannot fit; otherwise
Ray would leave the actors pending forever. `cluster.device: gpu` runs reserve
the layout (`GpuReservation`) in `driver/workers.py`; that path has run on Ray's
logical GPUs with tensors on the CPU (tests/test_gpu_wiring.py), never on a
real GPU.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from tailflow.config import ConfigError, RunConfig

CUDA_STAND_IN = "TAILFLOW_CUDA_STAND_IN"
"""Set to `cpu` on a machine without a GPU (tests): a `cluster.device: gpu` run still reserves Ray's (logical)
GPUs, seats every actor in its bundle and takes turns between phases, but the actors compute on the CPU. A
stand-in for what cannot exist here, named as such; unset, GPU actors compute on `cuda`."""


def torch_device(cluster_device: str) -> str:
    """The torch device a run's actors compute on: `cpu`, or `cuda` for `cluster.device: gpu` (each GPU actor
    sees only the GPU Ray gave it, so `cuda` is that one)."""
    if cluster_device != "gpu":
        return "cpu"
    stand_in = os.environ.get(CUDA_STAND_IN, "")
    if stand_in not in ("", "cpu"):
        raise ConfigError(f"{CUDA_STAND_IN}={stand_in!r}: only 'cpu' (or unset) is understood")
    return stand_in or "cuda"


def takes_turns(config: RunConfig) -> bool:
    """Whether rollout and training take turns on shared GPUs: colocated on GPUs, with a synchronous, unstreamed
    step. Then the engines sleep before the trainer trains and the trainer parks before the engines wake
    (`weight_sync.py`); with async or streamed training both phases run at once, so neither can sleep."""
    return (config.cluster.device == "gpu" and config.cluster.placement == "colocated"
            and config.rollout.async_ratio == 0 and not config.train.stream)


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
    """Each actor's ask: half a device colocated, a whole one disaggregated (a GPU actor also takes one CPU).
    On GPUs these are the asks inside `gpu_layout`'s bundles; the totals are the same."""
    share = 0.5 if placement == "colocated" else 1.0
    if device == "gpu":
        one = ActorResources(num_cpus=1, num_gpus=share)
    else:
        one = ActorResources(num_cpus=share, num_gpus=0)
    return Placement(rollout=one, trainer=one, num_rollout=num_rollout, num_trainer=num_trainer)


def check_fits(placement: "Placement | GpuLayout", available: dict[str, float], placement_name: str) -> None:
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
    needed = gpu_layout_of(config) if config.cluster.device == "gpu" else placement
    check_fits(needed, ray.cluster_resources(), config.cluster.placement)
    return placement


# ---- GPUs: placement-group bundles -------------------------------------------------------------------

@dataclass(frozen=True)
class Seat:
    """One actor's place: a bundle of a placement group, and what it asks for inside it."""

    group: int
    bundle: int
    num_cpus: float
    num_gpus: float


@dataclass(frozen=True)
class GroupSpec:
    """One Ray placement group: its bundles ({"GPU": 1, "CPU": n} each) and strategy (PACK or STRICT_SPREAD)."""

    bundles: tuple[dict[str, float], ...]
    strategy: str


@dataclass(frozen=True)
class GpuLayout:
    groups: tuple[GroupSpec, ...]
    trainer: tuple[Seat, ...]
    """Trainer rank r sits at trainer[r]."""
    rollout: tuple[Seat, ...]
    """Rollout worker w sits at rollout[w]."""
    critic: tuple[Seat, ...] = ()
    """Critic rank r (train.advantage gae) sits at critic[r], in trainer rank r's bundle."""

    @property
    def num_trainer(self) -> int:
        return len(self.trainer)

    @property
    def num_rollout(self) -> int:
        return len(self.rollout)

    def needs(self) -> dict[str, float]:
        """What the bundles reserve: whole GPUs, so a colocated bundle with one actor in it still takes one."""
        return {name: sum(bundle.get(name, 0.0) for group in self.groups for bundle in group.bundles)
                for name in ("CPU", "GPU")}


def gpu_layout(placement: str, num_rollout: int, num_trainer: int, spread_trainer_ranks: bool = False,
               with_critic: bool = False) -> GpuLayout:
    """The bundles and seats of a GPU run; one GPU per bundle, never two trainer ranks on one GPU.
    `with_critic` (train.advantage gae): critic rank r shares trainer rank r's GPU, the trainer's share halved
    (as veRL and ROLL colocate actor and critic); it waits in host memory while the engines roll out
    (`CriticTrainer.offload`)."""
    trainer_strategy = "STRICT_SPREAD" if spread_trainer_ranks else "PACK"
    num_critic = num_trainer if with_critic else 0
    if placement == "colocated":
        num_bundles = max(num_rollout, num_trainer)
        share = 0.25 if with_critic else 0.5
        bundles = tuple({"CPU": float((r < num_trainer) + (r < num_critic) + (r < num_rollout)), "GPU": 1.0}
                        for r in range(num_bundles))
        return GpuLayout(groups=(GroupSpec(bundles, trainer_strategy),),
                         trainer=tuple(Seat(0, r, 1, share) for r in range(num_trainer)),
                         rollout=tuple(Seat(0, w, 1, 0.5) for w in range(num_rollout)),
                         critic=tuple(Seat(0, r, 1, share) for r in range(num_critic)))
    share = 0.5 if with_critic else 1
    return GpuLayout(groups=(GroupSpec(({"CPU": 1.0 + with_critic, "GPU": 1.0},) * num_trainer, trainer_strategy),
                             GroupSpec(({"CPU": 1.0, "GPU": 1.0},) * num_rollout, "PACK")),
                     trainer=tuple(Seat(0, r, 1, share) for r in range(num_trainer)),
                     rollout=tuple(Seat(1, w, 1, 1) for w in range(num_rollout)),
                     critic=tuple(Seat(0, r, 1, share) for r in range(num_critic)))


def gpu_layout_of(config: RunConfig) -> GpuLayout:
    cluster = config.cluster
    return gpu_layout(cluster.placement, config.rollout.num_workers, config.train.num_workers,
                      cluster.spread_trainer_ranks, with_critic=config.train.has_critic)


def reserve(layout: GpuLayout, timeout_s: float = 120.0) -> list:
    """Create the layout's placement groups and wait until Ray has reserved them; refuse, with the numbers,
    when it cannot in `timeout_s` (Ray would otherwise wait forever)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    groups = [placement_group(list(spec.bundles), strategy=spec.strategy) for spec in layout.groups]
    ready, _ = ray.wait([group.ready() for group in groups], num_returns=len(groups), timeout=timeout_s)
    if len(ready) < len(groups):
        for group in groups:
            remove_placement_group(group)
        specs = "; ".join(f"{len(spec.bundles)} bundles {spec.strategy}" for spec in layout.groups)
        have = ray.cluster_resources()
        needs = ", ".join(f"{amount:g} {name} (the cluster has {have.get(name, 0.0):g})"
                          for name, amount in layout.needs().items())
        nodes = "a node per trainer rank" if "STRICT_SPREAD" in specs else "any nodes"
        raise ConfigError(f"cluster: Ray could not reserve the GPU placement ({specs}) in {timeout_s:g} s: it needs "
                          f"{needs}, one GPU per bundle, on {nodes}")
    return groups


class GpuReservation:
    """A run's reserved placement groups and the actors' seats in them; released (Ray frees the GPUs and stops
    anything left in them) when the last group holding it shuts down."""

    def __init__(self, layout: GpuLayout, groups: list) -> None:
        self.layout, self.groups = layout, groups
        self.holders = 0

    def rollout_options(self) -> list[dict]:
        return [actor_options(seat, self.groups) for seat in self.layout.rollout]

    def trainer_options(self) -> list[dict]:
        return [actor_options(seat, self.groups) for seat in self.layout.trainer]

    def critic_options(self) -> list[dict]:
        return [actor_options(seat, self.groups) for seat in self.layout.critic]

    def hold(self) -> "GpuReservation":
        self.holders += 1
        return self

    def drop(self) -> None:
        """One holder is done; the last one releases the placement groups (idempotent past zero)."""
        self.holders -= 1
        if self.holders <= 0 and self.groups:
            from ray.util.placement_group import remove_placement_group

            for group in self.groups:
                remove_placement_group(group)
            self.groups = []


def reserve_layout(layout: GpuLayout, timeout_s: float = 120.0) -> GpuReservation:
    return GpuReservation(layout, reserve(layout, timeout_s))


def actor_options(seat: Seat, groups: list) -> dict:
    """`ActorClass.options(**...)` for an actor in its seat."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(placement_group=groups[seat.group],
                                                placement_group_bundle_index=seat.bundle)
    return dict(num_cpus=seat.num_cpus, num_gpus=seat.num_gpus, scheduling_strategy=strategy)


def gpu_seat(actor) -> "ray.ObjectRef":
    """A ref to (node id, GPU ids: none on a CPU actor) of `actor`, asked inside its process: where Ray put it."""
    return actor.__ray_call__.remote(_where_am_i)


def _where_am_i(_actor) -> tuple[str, tuple[str, ...]]:
    import ray

    return ray.get_runtime_context().get_node_id(), tuple(str(gpu) for gpu in ray.get_gpu_ids())


def describe_gpu_seats(trainer_workers: list, rollout_workers: list) -> list[str]:
    """One line per actor for the run's log: which GPU of which node each trainer rank and rollout worker got."""
    import ray

    seats = ray.get([gpu_seat(actor) for actor in [*trainer_workers, *rollout_workers]])
    names = ([f"trainer rank {r}" for r in range(len(trainer_workers))]
             + [f"rollout worker {w}" for w in range(len(rollout_workers))])
    return [f"{name}: GPU {','.join(gpus) or '-'} on node {node[:8]}" for name, (node, gpus) in zip(names, seats)]
