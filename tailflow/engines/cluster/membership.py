"""Who is in an elastic rollout group (issue 17): its live workers, those joining, their seats, how many it keeps.

`RolloutGroup` holds one `Membership` and asks it; the group keeps what the
workers run (requests in flight and waiting, finish steps, stats). A started
worker loads the current weights and becomes a member only once it holds them
(`admit`). A worker removed, told it will be preempted (SIGUSR1, or Ray
draining its node: `node_drain.py`) or found dead leaves through `retire`,
after the group has moved its requests; unless the group was asked for fewer,
a replacement is started. Every join and leave is an event in the log
(`membership_log.py`), and a line said through `ElasticSettings.say`.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tailflow.engines.cluster import ACTOR_FAILURES
from tailflow.engines.cluster.membership_log import EventKind, MembershipLog
from tailflow.engines.cluster.node_drain import DRAIN_CHECK_S, DrainNotice, DrainWatch
from tailflow.engines.cluster.placement import gpu_seat
from tailflow.engines.cluster.worker_control import WorkerControl


def say_on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ElasticSettings:
    """How a rollout group's members may change while it runs. A run builds them from `rollout.elastic` and its
    store (`driver/workers.elastic_settings`); evaluation, tests and benches take the defaults or their own."""

    is_elastic: bool = True
    """False: a dead worker fails the group's call with `ACTOR_FAILURES` (the flow then restarts the iteration),
    nothing is replaced, drains are not watched and `keep_added` is ignored."""
    control: WorkerControl | None = None
    """Read between polls: the run's `tailflow workers add/remove` commands (`worker_control.py`)."""
    say: Callable[[str], Any] = say_on_stderr
    """Where the group's lines go: every join, leave, pause and resume (a run's log in a run)."""
    keep_added: int = 0
    """Workers added at runtime minus those removed before a resume or an iteration restart: the group keeps
    that many more than it is built with (`RolloutGroup.keep_added`)."""
    drain_check_s: float = DRAIN_CHECK_S
    """How often to ask Ray which nodes drain."""


@dataclass(frozen=True)
class WorkerLaunch:
    """How to start one rollout worker: its Ray actor class (with the resources a worker outside any seat asks
    for) and its engine's arguments."""

    actor_class: Any
    model_path: str
    num_slots: int
    max_seq_len: int
    seed: int
    num_threads: int
    device: str
    engine: str
    sleep_mode: bool
    multi_turn: Any = None
    """A `rollout.worker.MultiTurnSetup` (each worker gets its own copy of the environment connector)."""

    def start(self, worker_id: int, options: dict) -> Any:
        """Worker `worker_id`'s actor, placed by `options` (a seat; `{}`: the class's own resources), seeded
        apart from every other worker."""
        return self.actor_class.options(**options).remote(
            self.model_path, self.num_slots, self.max_seq_len, self.seed + worker_id * 1_000_003, self.num_threads,
            self.device, self.engine, self.sleep_mode, self.multi_turn)


@dataclass
class Joining:
    """A started worker loading the current weights; `ready` resolves when it holds them."""

    worker_id: int
    worker: Any
    ready: Any


class Seats:
    """The placement-group seats (on GPUs: a share of a reserved GPU) of the workers, and those left free."""

    def __init__(self) -> None:
        self.seat_of: dict[int, dict] = {}
        """Worker id -> the actor options of its seat (workers started outside a placement group: absent)."""
        self.free: list[dict] = []
        """Seats of workers gone: the next worker started takes one before asking Ray for new resources."""

    def take(self, worker_id: int, options: dict) -> dict:
        """Where worker `worker_id` starts: `options`, or, when none are given, a free seat if there is one."""
        if not options and self.free:
            options = self.free.pop(0)
        if "scheduling_strategy" in options:  # a reserved seat; other options (a node's resource) are not seats
            self.seat_of[worker_id] = options
        return options

    def release(self, worker_id: int, reusable: bool = True) -> None:
        """A gone worker's seat goes to the next worker started, unless not `reusable` (its node is leaving). (A
        lost worker's seat is reused too: if its node died, Ray moves the bundle to another node and the
        replacement waits for it there.)"""
        seat = self.seat_of.pop(worker_id, None)
        if seat and reusable:
            self.free.append(seat)


class Membership:
    def __init__(self, launch: WorkerLaunch, seats: Sequence[dict], settings: ElasticSettings) -> None:
        """A worker started in each of `seats` (actor options), every one waited for until it holds its weights
        (a worker that cannot start raises)."""
        self.launch, self.settings = launch, settings
        self.workers: list[Any] = []
        """The live workers' actor handles, in join order: a worker's index here is its rank in the group."""
        self.worker_ids: list[int] = []
        """Each live worker's stable id (0, 1, ... in start order, never reused)."""
        self.joining: list[Joining] = []
        """Started workers still loading the current weights: they get no request until they hold them."""
        self.node_of: dict[int, str] = {}
        """Live worker id -> the Ray node it runs on: a worker on a node Ray drains leaves as if told."""
        self.next_id = 0
        self.seats = Seats()
        self.num_started = self.num_wanted = len(seats)
        """Workers the group was built with; workers it keeps (`add`, `release` and `keep_added` move it)."""
        self.weights: tuple[Any, int] | None = None
        """The current weights (object ref, version): a starting worker loads them before it becomes a member."""
        self.log = MembershipLog()
        self.drain_watch = DrainWatch(settings.drain_check_s, say=settings.say)
        for options in seats:
            self._spawn(options)
        self.admit(wait=True, announce=False)

    @property
    def weight_version(self) -> int:
        return self.weights[1] if self.weights is not None else 0

    def _spawn(self, options: dict) -> int:
        """Start a worker and have it load the current weights; it becomes a member (`admit`) once it has them."""
        worker_id, self.next_id = self.next_id, self.next_id + 1
        worker = self.launch.start(worker_id, self.seats.take(worker_id, options))
        self.joining.append(Joining(worker_id, worker, self._load_current(worker)))
        return worker_id

    def _load_current(self, worker) -> Any:
        """A ref that is ready once `worker` holds the current weights (those it was built with, if none)."""
        return worker.load_weights.remote(*self.weights) if self.weights is not None else worker.weight_version.remote()

    def hold_weights(self, weights_ref, version: int) -> None:
        """The weights the members are being given; a worker still joining loads them before it joins."""
        self.weights = (weights_ref, version)
        for joining in self.joining:  # calls run in order: this load is the one a joiner waits for now
            joining.ready = self._load_current(joining.worker)

    def admit(self, wait: bool = False, announce: bool = True) -> None:
        """Workers the group keeps but has not started are started; started workers that now hold the current
        weights become members (`wait`: all of them, and one that fails to start raises)."""
        import ray

        self.top_up()
        if not self.joining:
            return
        refs = [joining.ready for joining in self.joining]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=None if wait else 0)[0])
        admitted = [j for j in self.joining if j.ready in ready]
        self.joining = [j for j in self.joining if j.ready not in ready]
        for joining in sorted(admitted, key=lambda j: j.worker_id):
            self._join(joining, wait, announce)

    def _join(self, joining: Joining, wait: bool, announce: bool) -> None:
        """`joining` holds the weights: a member from now on. One that died before it joined is not replaced (a
        bad model path would respawn forever)."""
        import ray

        try:
            ray.get(joining.ready)
            node_id = ray.get(gpu_seat(joining.worker))[0]  # (node, GPUs): where Ray put it
        except ACTOR_FAILURES as error:
            if wait:
                raise
            self.num_wanted -= 1
            self.seats.release(joining.worker_id)
            self.log.record(EventKind.LOST, joining.worker_id, detail=f"before joining: {error}")
            self.settings.say(f"[tailflow] rollout worker {joining.worker_id} died before joining: {error}")
            return
        self.workers.append(joining.worker)
        self.worker_ids.append(joining.worker_id)
        self.node_of[joining.worker_id] = node_id
        if announce:
            self.log.record(EventKind.JOIN, joining.worker_id, weight_version=self.weight_version)
            self.settings.say(f"[tailflow] rollout worker {joining.worker_id} joined with weights "
                              f"v{self.weight_version}; {len(self.workers)} rolling out")

    def top_up(self) -> None:
        """Start workers until the group has (live or joining) as many as it keeps; elastic groups only."""
        while self.settings.is_elastic and len(self.workers) + len(self.joining) < self.num_wanted:
            self._spawn({})

    def add(self, count: int) -> list[int]:
        """`count` more workers kept, started now; their ids."""
        self.num_wanted += count
        return [self._spawn({}) for _ in range(count)]

    def is_member(self, worker_id: int) -> bool:
        """Live or joining."""
        return worker_id in self.worker_ids or any(j.worker_id == worker_id for j in self.joining)

    def release(self, worker_id: int) -> bool:
        """Worker `worker_id` goes and is not replaced. One still joining is stopped here (True); a live one stays
        a member until the group has handed its requests over and retires it (False)."""
        import ray

        joining = next((j for j in self.joining if j.worker_id == worker_id), None)
        if joining is None and worker_id not in self.worker_ids:
            raise ValueError(f"no live or joining rollout worker {worker_id}; live: {self.worker_ids}")
        self.num_wanted -= 1
        if joining is None:
            return False
        self.joining.remove(joining)
        ray.kill(joining.worker)
        self.seats.release(worker_id)
        self.log.record(EventKind.LEAVE, worker_id, detail="removed before joining")
        return True

    def retire(self, rank: int, kind: EventKind, detail: str, num_requests: int, node_leaves: bool = False) -> int:
        """Member `rank` leaves (`kind` LEAVE or LOST; the group has taken its `num_requests` requests) and is
        stopped; a replacement is started unless the group keeps fewer now. `node_leaves`: it goes because its node
        does (preemption notice, drain), so its seat there is not given to the next worker. Its id."""
        import ray

        worker, worker_id = self.workers.pop(rank), self.worker_ids.pop(rank)
        self.node_of.pop(worker_id, None)
        ray.kill(worker)
        self.seats.release(worker_id, reusable=not node_leaves)
        self.log.record(kind, worker_id, num_requests=num_requests, detail=detail)
        self.settings.say(f"[tailflow] rollout worker {worker_id} {'left' if kind is EventKind.LEAVE else 'was lost'}"
                          f" ({detail}); {num_requests} requests move to the {len(self.workers)} others")
        self.top_up()
        return worker_id

    def workers_added(self) -> int:
        """Workers added since the group was built minus those removed (a lost or preempted one is replaced, so
        it does not count): what a run commits so that a resume keeps them (`keep_added`)."""
        return self.num_wanted - self.num_started

    def keep_added(self, added: int) -> list[int]:
        """Keep `added` more workers than the group was built with (fewer if negative, never fewer than none).
        Those to add start at the next `admit` (the group's next poll), so a group built with them asks Ray for
        them only after the run's other actors are placed; the ids to remove instead, newest first. A group that
        is not elastic keeps what it was built with."""
        if not self.settings.is_elastic:
            return []
        change = max(added, -self.num_started) - self.workers_added()
        self.num_wanted += max(0, change)
        newest_first = sorted([*self.worker_ids, *(j.worker_id for j in self.joining)], reverse=True)
        return newest_first[:max(0, -change)]

    def drain_notices(self) -> list[DrainNotice]:
        """Live workers on nodes Ray is draining (asked at most every `drain_check_s`; elastic groups only)."""
        return self.drain_watch.notices(self.node_of) if self.settings.is_elastic else []

    def shutdown(self) -> None:
        """Stop every worker, live or joining."""
        import ray

        for worker in [*self.workers, *(joining.worker for joining in self.joining)]:
            ray.kill(worker)
        self.workers.clear()
        self.worker_ids.clear()
        self.joining.clear()
        self.node_of.clear()
