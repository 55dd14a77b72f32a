"""The rollout workers of a run: Ray actors that each host one engine.

Two ways to drive them. `generate` runs a batch to completion (the
synchronous baseline). `submit` / `poll` / `abort` stream: each request goes
to the worker with the fewest in flight (lowest index on ties), `poll` runs a
few engine steps on every busy worker and returns what finished merged by
engine step (the i-th step of every worker before any worker's next).
Nothing depends on wall-clock timing, so with one worker a seeded run is
reproducible bit for bit.

The group is elastic (issue 17; how workers join and leave, and what each
leave keeps: docs/operations.md, "Elastic rollout workers"), and the caller
(`tail/pipeline.py`) sees only timing. Who is in the group, who is joining
and which seat each holds is the group's `Membership` (`membership.py`); the
group keeps every request in flight and the tokens each has streamed back so
far (`in_flight.py`; `step_streamed` reports them with each poll), so a
leaving worker's requests continue elsewhere. With no worker left `poll`
returns nothing and `has_unfinished` stays true until one joins. How members
may change is fixed at construction (`ElasticSettings`).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from tailflow.engines.cluster import ACTOR_FAILURES
from tailflow.engines.cluster.in_flight import InFlight
from tailflow.engines.cluster.membership import ElasticSettings, Membership, WorkerLaunch
from tailflow.engines.cluster.membership_log import EventKind, MembershipChanges
from tailflow.engines.rollout.protocol import Completion, EngineStats, Request

JOIN_HEADROOM = 8
"""`stats()` lists this many not-yet-joined seats (zeros) after the newest worker, so a caller's before/after
difference (`summarize_rollout` zips them) counts a worker that joined in between from its first token."""

GENERATE_STEPS = 64
"""Engine steps per poll when `generate` runs a batch to completion."""

PAUSED_WAIT_S = 1.0
"""With no worker left, how long one `poll` waits for a join before returning nothing."""


def share_by_load(requests: Sequence[Request], loads: list[int], worker_of: dict[str, int]) -> list[list[Request]]:
    """Each request to the worker with the fewest in flight (lowest index on ties); records it in `worker_of`.
    The simulated group (engines/sim/group.py) places with this same function."""
    loads = list(loads)
    shares: list[list[Request]] = [[] for _ in loads]
    for request in requests:
        rank = min(range(len(loads)), key=lambda r: (loads[r], r))
        shares[rank].append(request)
        loads[rank] += 1
        worker_of[request.request_id] = rank
    return shares


def take_by_worker(request_ids: Sequence[str], worker_of: dict[str, int]) -> list[tuple[int, list[str]]]:
    """The in-flight ids among `request_ids`, removed from `worker_of`, grouped by worker in worker order."""
    by_rank: dict[int, list[str]] = {}
    for request_id in request_ids:
        if request_id in worker_of:
            by_rank.setdefault(worker_of.pop(request_id), []).append(request_id)
    return sorted(by_rank.items())


class RolloutGroup:
    def __init__(self, model_path: str, num_workers: int, num_slots: int, max_seq_len: int, seed: int, num_threads: int,
                 num_cpus: float = 1, num_gpus: float = 0, engine: str = "native", device: str = "cpu",
                 sleep_mode: bool = False, actor_options: Sequence[dict] | None = None,
                 reservation: Any = None, elastic: ElasticSettings = ElasticSettings(), multi_turn: Any = None):
        """`actor_options[w]`, when given, places worker w (`placement.actor_options`: its placement-group bundle
        and share of it) instead of `num_cpus` / `num_gpus`; `engine`, `device` and `sleep_mode` (vLLM's, for
        colocated GPUs) reach each worker's `build_engine`. Workers added later get `num_cpus` / `num_gpus`.
        `reservation` (a `placement.GpuReservation`): the placement groups the workers sit in, held until
        `shutdown`. `elastic`: how members may change, what is said, and the workers to keep beyond these.
        `multi_turn` (a `rollout.worker.MultiTurnSetup`): every worker's requests are multi-turn trajectories."""
        import ray

        from tailflow.engines.rollout.worker import RolloutWorker

        options = list(actor_options) if actor_options is not None else [{}] * num_workers
        if len(options) != num_workers:
            raise ValueError(f"{len(options)} actor options for {num_workers} rollout workers")
        actor_class = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0)(RolloutWorker)
        launch = WorkerLaunch(actor_class, model_path, num_slots, max_seq_len, seed, num_threads, device, engine,
                              sleep_mode, multi_turn)
        self.num_slots, self.elastic = num_slots, elastic
        self.worker_of: dict[str, int] = {}
        """In-flight request id -> rank (index in `membership.workers`) of the worker running it."""
        self.finish_steps: dict[str, tuple[int, int]] = {}
        """This round's finished request id -> (worker, step of the round it finished at), for traces."""
        self.in_flight = InFlight()
        """Every request in flight and its tokens so far, as the workers streamed them back."""
        self.orphans: list[Request] = []
        """Requests waiting for a worker (none left), in submission order; `is_paused` meanwhile."""
        self.is_paused = False
        self.seat_stats: dict[int, EngineStats] = {}
        """Worker id -> its engine's last counters (a departed worker keeps them)."""
        self.membership = Membership(launch, options, elastic)
        self.env_group = None
        """The environment workers (`cluster/env_group.EnvGroup`) of a multi-turn run: shut down with the group."""
        self.reservation = reservation.hold() if reservation is not None else None
        self.keep_added(elastic.keep_added)

    # ---- placing requests on the workers ---------------------------------------------------

    def _place(self, requests: list[Request]) -> None:
        """Requests (already in `in_flight`) to the live workers by load, or to the waiting list when none is left."""
        workers = self.membership.workers
        if not workers:
            self.orphans += requests
            self._say_paused(len(self.orphans))
            return
        shares = share_by_load(requests, self.in_flight_per_worker(), self.worker_of)
        ranks = [rank for rank, share in enumerate(shares) if share]
        self._each(ranks, lambda rank: workers[rank].submit.remote(shares[rank]))

    def _each(self, ranks: Sequence[int], call: Callable[[int], Any]) -> dict[int, Any]:
        """`call(rank)` on each worker; the results of those alive, keyed by their rank at the call. A worker
        whose call fails with an actor failure is retired (its requests move); any other error is raised."""
        import ray

        ids = {rank: self.membership.worker_ids[rank] for rank in ranks}
        refs = {rank: call(rank) for rank in ranks}
        results, dead = {}, []
        for rank, ref in refs.items():
            try:
                results[rank] = ray.get(ref)
            except ACTOR_FAILURES as error:
                if not self.elastic.is_elastic:
                    raise
                dead.append((ids[rank], type(error).__name__))
        for worker_id, detail in dead:
            if worker_id in self.membership.worker_ids:
                self._retire(self.membership.worker_ids.index(worker_id), EventKind.LOST, detail)
        return results

    def _on_every_worker(self, call: Callable[[Any], Any]) -> dict[int, Any]:
        """`call(worker)` on every live worker, through `_each`."""
        workers = self.membership.workers
        return self._each(range(len(workers)), lambda rank: call(workers[rank]))

    # ---- requests ------------------------------------------------------------------------------

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        """Run all requests to completion; completions come back in request order. Streamed in polls of
        GENERATE_STEPS engine steps (about one round trip per batch call's worth of work), so a worker lost
        mid-batch costs only the tokens since its last poll, like a streamed round."""
        self.finish_steps.clear()
        self.submit(requests)
        by_id: dict[str, Completion] = {}
        while len(by_id) < len(requests):
            finished = self.poll(GENERATE_STEPS)
            if not finished and not self.has_unfinished():
                lost = [r.request_id for r in requests if r.request_id not in by_id]
                raise RuntimeError(f"generate: requests {lost[:5]} ({len(lost)}) are no longer in flight")
            by_id.update((c.request_id, c) for c in finished)
        return [by_id[request.request_id] for request in requests]

    def submit(self, requests: Sequence[Request]) -> None:
        if not self.worker_of and not self.orphans:
            self.finish_steps.clear()  # a new round
        self.in_flight.add(requests)
        self._place(list(requests))

    def poll(self, max_steps: int) -> list[Completion]:
        """Up to `max_steps` engine steps on every busy worker; finished completions merged by engine step
        (the i-th step of every worker before the (i+1)-th of any), then worker: merging worker by worker
        would let worker 0's whole poll finish "first" and favour it in the completion rule. Membership
        changes (control commands, joins, notices, deaths) are applied here, between engine steps."""
        self.apply_control()
        self._admit()
        self._leave_draining_nodes()
        workers = self.membership.workers
        if not workers:
            self._wait_for_workers(len(self.orphans))
            return []
        ranks = range(len(workers))  # the idle too: one may have been told it is preempted
        ids = {rank: self.membership.worker_ids[rank] for rank in ranks}
        busy = {rank for rank, load in enumerate(self.in_flight_per_worker()) if load}
        started = time.perf_counter()
        steps = self._each(ranks, lambda rank: workers[rank].step_streamed.remote(max_steps))
        seconds = time.perf_counter() - started
        tagged, leaving = [], []
        for rank, step in steps.items():
            if rank in busy:
                self.membership.log.count_work(ids[rank], step.num_tokens, seconds)
            for delta in step.progress:
                self.in_flight.extend(delta)
            if step.is_leaving:
                leaving.append(ids[rank])
            tagged += [(f.offset, rank, index, f) for index, f in enumerate(step.finished)]
        tagged.sort(key=lambda item: item[:3])
        for _, rank, _, f in tagged:
            self._forget(f.completion.request_id)
            self.finish_steps[f.completion.request_id] = (rank, f.step)
        for worker_id in leaving:
            if worker_id in self.membership.worker_ids:
                self._hand_over(worker_id, "preemption notice", node_leaves=True)
        return [f.completion for *_, f in tagged]

    def _forget(self, request_id: str) -> None:
        self.worker_of.pop(request_id, None)
        self.in_flight.forget(request_id)

    def abort(self, request_ids: Sequence[str]) -> list[Completion]:
        """Abort in-flight requests (unknown or finished ids are ignored); their partial completions."""
        wanted = set(request_ids)
        waiting = [r for r in self.orphans if r.request_id in wanted]
        self.orphans = [r for r in self.orphans if r.request_id not in wanted]
        version = self.membership.weight_version
        partials = [self.in_flight.partial(r.request_id, version) for r in waiting]
        by_rank = take_by_worker(request_ids, self.worker_of)
        ranks = [rank for rank, _ in by_rank]
        ids_of, workers = dict(by_rank), self.membership.workers
        results = self._each(ranks, lambda rank: workers[rank].abort.remote(ids_of[rank]))
        partials += [completion for rank in sorted(results) for completion in results[rank]]
        got = {c.request_id for c in partials}
        # A worker that died holding some of them: their partials are the tokens streamed before it died.
        partials += [self.in_flight.partial(rid, version) for _, ids in by_rank for rid in ids
                     if rid not in got and rid in self.in_flight and rid not in self.worker_of]
        for completion in partials:
            self._forget(completion.request_id)
        return partials

    def has_unfinished(self) -> bool:
        """Any request still waits or runs; asked only when a poll returned nothing (one extra round trip)."""
        if self.orphans:
            return True
        self._admit()
        results = self._on_every_worker(lambda worker: worker.has_unfinished.remote())
        return any(results.values()) or bool(self.orphans) or bool(self.worker_of)

    def in_flight_per_worker(self) -> list[int]:
        loads = [0] * len(self.membership.workers)
        for rank in self.worker_of.values():
            loads[rank] += 1
        return loads

    # ---- weights and engines -------------------------------------------------------------------

    def load_weights(self, state_dict: dict, version: int) -> None:
        """Every worker loads these weights (put once into the object store) before any new request."""
        import ray

        self.load_weights_ref(ray.put(state_dict), version)

    def load_weights_ref(self, state_dict_ref, version: int) -> None:
        """The same from a state dict already in the object store (`weight_sync.py`: no copy via the driver).
        The membership keeps the ref: a worker that joins later loads it before it gets work."""
        self.membership.hold_weights(state_dict_ref, version)
        self._on_every_worker(lambda worker: worker.load_weights.remote(state_dict_ref, version))

    def sleep(self) -> None:
        """Every engine frees its GPU memory for the trainer (vLLM's level-2 sleep; the native engine keeps its
        weights in host memory)."""
        self._on_every_worker(lambda worker: worker.sleep.remote())

    def wake_up(self) -> None:
        """Every engine takes its memory back (after weights were loaded); a no-op for awake engines."""
        self._on_every_worker(lambda worker: worker.wake_up.remote())

    def stats(self) -> list[EngineStats]:
        """One entry per worker id ever (a departed worker keeps its last counters), then JOIN_HEADROOM zeros
        for workers yet to join: entry i is always worker i, so before/after differences line up."""
        ids = list(self.membership.worker_ids)
        for rank, stats in self._on_every_worker(lambda worker: worker.stats.remote()).items():
            self.seat_stats[ids[rank]] = stats
        empty = EngineStats(self.num_slots, 0, 0, self.membership.weight_version, 0, 0, 0)
        return [self.seat_stats.get(worker_id, empty) for worker_id in range(self.membership.next_id + JOIN_HEADROOM)]

    def worker_pid(self, index: int = 0) -> int:
        """The OS process of worker `index` (fault-injection tests kill it)."""
        import ray

        return ray.get(self.membership.workers[index].pid.remote())

    def shutdown(self) -> None:
        self.membership.shutdown()
        if self.env_group is not None:
            self.env_group.shutdown()
            self.env_group = None
        self.worker_of.clear()
        self.in_flight = InFlight()
        self.orphans = []
        if self.reservation is not None:
            self.reservation.drop()
            self.reservation = None

    # ---- members joining and leaving (`membership.py` keeps who is in) ---------------------------

    def _admit(self, wait: bool = False) -> None:
        """Started workers that hold the current weights take requests; after a pause, the waiting ones."""
        self.membership.admit(wait)
        if self.membership.workers and self.is_paused:
            waiting, self.orphans, self.is_paused = self.orphans, [], False
            self.membership.log.record(EventKind.RESUME)
            self.elastic.say(f"[tailflow] rollout resumed: {len(waiting)} requests go to "
                             f"{len(self.membership.workers)} workers")
            self._place(waiting)

    def add_workers(self, count: int, wait: bool = False) -> list[int]:
        """`count` more workers; each takes requests once it holds the current weights (`wait`: return only
        then). Their ids."""
        added = self.membership.add(count)
        self._admit(wait)
        return added

    def wait_for_joins(self) -> None:
        """Block until every started worker holds the current weights and takes requests."""
        self._admit(wait=True)

    def workers_added(self) -> int:
        """Workers added since the group was built minus those removed: what a run commits (`keep_added`)."""
        return self.membership.workers_added()

    def keep_added(self, added: int) -> None:
        """Keep `added` more workers than the group was built with (fewer if negative, the newest removed now): a
        resumed or restarted run keeps the workers added or removed while it ran (`ElasticSettings.keep_added`,
        applied at construction). New ones start at the next poll and take requests once Ray places them and
        they hold the current weights."""
        for worker_id in self.membership.keep_added(added):
            self.remove_worker(worker_id)

    def remove_worker(self, worker_id: int) -> None:
        """Worker `worker_id` leaves with notice and is not replaced: its requests are aborted (every token
        kept) and resubmitted to the others, then it is stopped. A worker still joining is stopped at once."""
        if not self.membership.release(worker_id):
            self._hand_over(worker_id, "removed")

    def _hand_over(self, worker_id: int, detail: str, node_leaves: bool = False) -> None:
        """Worker `worker_id` leaves with notice: its partial responses replace what was streamed of them, then
        it retires. `node_leaves`: see `Membership.retire`."""
        import ray

        rank = self.membership.worker_ids.index(worker_id)
        try:
            partials = ray.get(self.membership.workers[rank].abort_all.remote())
        except ACTOR_FAILURES as error:
            self._retire(rank, EventKind.LOST, type(error).__name__, node_leaves)
            return
        self.in_flight.hand_over(partials)
        self._retire(rank, EventKind.LEAVE, detail, node_leaves)

    def _retire(self, rank: int, kind: EventKind, detail: str, node_leaves: bool = False) -> None:
        """Worker `rank` leaves the membership; its requests move to the others (from the tokens streamed so far)."""
        moved = [rid for rid, r in self.worker_of.items() if r == rank]
        self.worker_of = {rid: (r - 1 if r > rank else r) for rid, r in self.worker_of.items() if r != rank}
        worker_id = self.membership.retire(rank, kind, detail, len(moved), node_leaves)
        continued = self.in_flight.continued(moved)
        if continued:
            self.membership.log.record(EventKind.MIGRATE, worker_id, num_requests=len(continued),
                                       num_tokens=sum(len(r.prefix.token_ids) for r in continued if r.prefix),
                                       request_ids=tuple(r.request_id for r in continued))
            self._place(continued)

    def _say_paused(self, num_waiting: int) -> None:
        """No worker left: pause, and say so once per pause."""
        if self.is_paused:
            return
        self.is_paused = True
        self.membership.log.record(EventKind.PAUSE, num_requests=num_waiting)
        joining = self.membership.joining
        starting = (f"{len(joining)} starting (they join once Ray can place them)" if joining
                    else "none starting: `tailflow workers add RUN_ID N`")
        self.elastic.say(f"[tailflow] rollout paused: no rollout worker left, {num_waiting} requests wait for one "
                         f"to join; {starting}")

    def apply_control(self) -> None:
        """Apply the `tailflow workers add/remove` commands waiting in the run's control channel, if any."""
        if self.elastic.control is None:
            return
        for command in self.elastic.control.take():
            if command.add:
                self.add_workers(command.add)
            elif command.remove is not None:
                if self.membership.is_member(command.remove):
                    self.remove_worker(command.remove)
                else:
                    self.elastic.say(f"[tailflow] workers remove {command.remove}: no such live worker "
                                     f"({self.membership.worker_ids})")

    def take_membership(self) -> MembershipChanges:
        """Joins, leaves and migrations since the last take, and their counters (once per iteration)."""
        return self.membership.log.take(len(self.membership.workers))

    def _leave_draining_nodes(self) -> None:
        """Workers on a node Ray is draining hand their requests over and leave, as with a preemption notice;
        their replacements go where Ray places them (never on a draining node)."""
        for notice in self.membership.drain_notices():
            if notice.worker_id in self.membership.worker_ids:
                self._hand_over(notice.worker_id, notice.detail(time.time()), node_leaves=True)

    def _wait_for_workers(self, num_waiting: int) -> None:
        """No worker: say so (once per pause), then wait up to PAUSED_WAIT_S for one to join."""
        self._say_paused(num_waiting)
        deadline = time.perf_counter() + PAUSED_WAIT_S
        while not self.membership.workers and time.perf_counter() < deadline:
            time.sleep(0.1)
            self.apply_control()
            self._admit()  # members join only in `_admit`, which also ends the pause
