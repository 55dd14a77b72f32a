"""The rollout workers of a run: Ray actors that each host one engine.

Two ways to drive them. `generate` runs a batch to completion (the
synchronous baseline). `submit` / `poll` / `abort` stream: each request goes
to the worker with the fewest in flight (lowest index on ties), `poll` runs a
few engine steps on every busy worker and returns what finished merged by
engine step (the i-th step of every worker before any worker's next). Nothing depends on wall-clock timing, so with one worker a seeded
run is reproducible bit for bit.

The group is elastic (issue 17; how members come and go: `elastic_membership.py`): workers join (`add_workers`) and leave
(`remove_worker`, a preemption notice: a signal or a Ray drain of its node; or death) at any moment, and the
callers (`tail/driver.py`, `tail/pipeline.py`) see only timing. The driver
keeps every request in flight and the tokens each has streamed back so far
(`step_streamed` reports them with each poll); a worker that leaves with
notice hands its requests over whole (aborted, every token kept), one that
dies loses at most the tokens since its last poll; either way its requests
are resubmitted to the others with their tokens as a `ResponsePrefix` (each
token keeps its weight version and log-prob) and, seeded, draw exactly what
they would have drawn. A joining worker loads the current weights before it
is given any request. With no worker left the requests wait (`poll` returns
nothing, `has_unfinished` stays true) until one joins. Only an actor call
that fails (`ACTOR_FAILURES`) counts a worker dead: a slow one is waited for.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Sequence

from tailflow.engines.cluster import ACTOR_FAILURES
from tailflow.engines.cluster.in_flight import InFlight
from tailflow.engines.cluster.elastic_membership import ElasticMembership, Joining
from tailflow.engines.cluster.membership import EventKind, Membership
from tailflow.engines.cluster.node_drain import DrainWatch
from tailflow.engines.rollout.protocol import Completion, EngineStats, Request

JOIN_HEADROOM = 8
"""`stats()` lists this many not-yet-joined seats (zeros) after the newest worker, so a caller's before/after
difference (`summarize_rollout` zips them) counts a worker that joined in between from its first token."""

GENERATE_STEPS = 64
"""Engine steps per poll when `generate` runs a batch to completion."""

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


class RolloutGroup(ElasticMembership):
    def __init__(self, model_path: str, num_workers: int, num_slots: int, max_seq_len: int, seed: int, num_threads: int,
                 num_cpus: float = 1, num_gpus: float = 0, engine: str = "native", device: str = "cpu",
                 sleep_mode: bool = False, actor_options: Sequence[dict] | None = None,
                 reservation: Any = None):
        """`actor_options[w]`, when given, places worker w (`placement.actor_options`: its placement-group bundle
        and share of it) instead of `num_cpus` / `num_gpus`; `engine`, `device` and `sleep_mode` (vLLM's, for
        colocated GPUs) reach each worker's `build_engine`. Workers added later get `num_cpus` / `num_gpus`.
        `reservation` (a `placement.GpuReservation`): the placement groups the workers sit in, held until
        `shutdown`."""
        import ray

        from tailflow.engines.rollout.worker import RolloutWorker

        self.actor_class = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0)(RolloutWorker)
        self.worker_args = (model_path, num_slots, max_seq_len, seed, num_threads, device, engine, sleep_mode)
        options = list(actor_options) if actor_options is not None else [{}] * num_workers
        if len(options) != num_workers:
            raise ValueError(f"{len(options)} actor options for {num_workers} rollout workers")
        self.num_slots = num_slots
        self.workers: list[Any] = []
        """The live workers' actor handles, in join order."""
        self.worker_ids: list[int] = []
        """Each live worker's stable id (0, 1, ... in join order, never reused)."""
        self.next_id = 0
        self.worker_of: dict[str, int] = {}
        """In-flight request id -> index (in `workers`) of the worker running it."""
        self.finish_steps: dict[str, tuple[int, int]] = {}
        """This round's finished request id -> (worker, step of the round it finished at), for traces."""
        self.in_flight = InFlight()
        """Every request in flight and its tokens so far, as the workers streamed them back."""
        self.orphans: list[Request] = []
        """Requests waiting for a worker (none left), in submission order."""
        self.weights: tuple[Any, int] | None = None
        """The current weights (object ref, version): a joining worker loads them before it gets work."""
        self.seat_stats: dict[int, EngineStats] = {}
        self.membership = Membership()
        self.control: Any = None
        """A `WorkerControl` (`worker_control.py`) read between polls: `tailflow workers add/remove`."""
        self.say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
        self.is_paused = False
        self.is_elastic = True
        """False: a dead worker fails the call with `ACTOR_FAILURES` (the flow then restarts the iteration)."""
        self.num_started = num_workers
        """Workers the group was built with (`rollout.num_workers` in a run)."""
        self.num_wanted = num_workers
        """Workers the group keeps: `add_workers` / `remove_worker` move it; a worker lost or preempted is
        replaced by a new one, which joins when Ray can place it (a pause meanwhile if none is left)."""
        self.joining: list[Joining] = []
        """Started workers still loading the current weights: they get no request until they hold them."""
        self.node_of: dict[int, str] = {}
        """Live worker id -> the Ray node it runs on: a worker on a node Ray drains leaves as if told."""
        self.drain_watch = DrainWatch(say=lambda line: self.say(line))
        self.reservation = None
        self.seat_of: dict[int, dict] = {}
        """Worker id -> the actor options of its placement-group seat (workers started outside one: absent)."""
        self.free_seats: list[dict] = []
        """Seats of workers gone: a replacement or an added worker takes one before asking Ray for new resources."""
        for rank in range(num_workers):
            self._spawn(options[rank])
        self._admit_joiners(wait=True, announce=False)
        self.reservation = reservation.hold() if reservation is not None else None

    # ---- placing requests on the workers ---------------------------------------------------

    def _place(self, requests: list[Request]) -> None:
        """Requests (already in `in_flight`) to the live workers by load, or to the waiting list when none is left."""
        if not self.workers:
            self.orphans += requests
            if not self.is_paused:
                self._say_paused(len(self.orphans))
            return
        shares = share_by_load(requests, self.in_flight_per_worker(), self.worker_of)
        ranks = [rank for rank, share in enumerate(shares) if share]
        self._each(ranks, lambda rank: self.workers[rank].submit.remote(shares[rank]))

    def _each(self, ranks: Sequence[int], call: Callable[[int], Any]) -> dict[int, Any]:
        """`call(rank)` on each worker; the results of those alive, keyed by their rank at the call. A worker
        whose call fails with an actor failure is retired (its requests move); any other error is raised."""
        import ray

        ids = {rank: self.worker_ids[rank] for rank in ranks}
        refs = {rank: call(rank) for rank in ranks}
        results, dead = {}, []
        for rank, ref in refs.items():
            try:
                results[rank] = ray.get(ref)
            except ACTOR_FAILURES as error:
                if not self.is_elastic:
                    raise
                dead.append((ids[rank], type(error).__name__))
        for worker_id, detail in dead:
            if worker_id in self.worker_ids:
                self._retire(self.worker_ids.index(worker_id), EventKind.LOST, detail)
        return results

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
        changes (control commands, notices, deaths) are applied here, between engine steps."""
        self.apply_control()
        self._admit_joiners()
        self._leave_draining_nodes()
        if not self.workers:
            self._wait_for_workers(len(self.orphans))
            return []
        ranks = range(len(self.workers))  # the idle too: one may have been told it is preempted
        ids = {rank: self.worker_ids[rank] for rank in ranks}
        busy = {rank for rank, load in enumerate(self.in_flight_per_worker()) if load}
        started = time.perf_counter()
        reports = self._each(ranks, lambda rank: self.workers[rank].step_streamed.remote(max_steps))
        seconds = time.perf_counter() - started
        tagged, leaving = [], []
        for rank, report in reports.items():
            if rank in busy:
                self.membership.count_work(ids[rank], report.num_tokens, seconds)
            for delta in report.progress:
                self.in_flight.extend(delta)
            if report.is_leaving:
                leaving.append(ids[rank])
            tagged += [(f.offset, rank, index, f) for index, f in enumerate(report.finished)]
        tagged.sort(key=lambda item: item[:3])
        for _, rank, _, f in tagged:
            self._forget(f.completion.request_id)
            self.finish_steps[f.completion.request_id] = (rank, f.step)
        for worker_id in leaving:
            if worker_id in self.worker_ids:
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
        version = self.weights[1] if self.weights is not None else 0
        partials = [self.in_flight.partial(r.request_id, version) for r in waiting]
        by_rank = take_by_worker(request_ids, self.worker_of)
        ranks = [rank for rank, _ in by_rank]
        ids_of = dict(by_rank)
        results = self._each(ranks, lambda rank: self.workers[rank].abort.remote(ids_of[rank]))
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
        self._admit_joiners()
        results = self._each(range(len(self.workers)), lambda rank: self.workers[rank].has_unfinished.remote())
        return any(results.values()) or bool(self.orphans) or bool(self.worker_of)

    def in_flight_per_worker(self) -> list[int]:
        loads = [0] * len(self.workers)
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
        The group keeps the ref: a worker that joins later loads it before it gets work."""
        self.weights = (state_dict_ref, version)
        for joining in self.joining:  # calls run in order: this load is the one a joiner waits for now
            joining.ready = self._load_current(joining.worker)
        self._each(range(len(self.workers)), lambda rank: self.workers[rank].load_weights.remote(state_dict_ref,
                                                                                                  version))

    def sleep(self) -> None:
        """Every engine frees its GPU memory for the trainer (vLLM's level-2 sleep; the native engine keeps its weights in host memory)."""
        self._each(range(len(self.workers)), lambda rank: self.workers[rank].sleep.remote())

    def wake_up(self) -> None:
        """Every engine takes its memory back (after weights were loaded); a no-op for awake engines."""
        self._each(range(len(self.workers)), lambda rank: self.workers[rank].wake_up.remote())

    def stats(self) -> list[EngineStats]:
        """One entry per worker id ever (a departed worker keeps its last counters), then JOIN_HEADROOM zeros
        for workers yet to join: entry i is always worker i, so before/after differences line up."""
        ids = list(self.worker_ids)
        results = self._each(range(len(self.workers)), lambda rank: self.workers[rank].stats.remote())
        for rank, stats in results.items():
            self.seat_stats[ids[rank]] = stats
        version = self.weights[1] if self.weights is not None else 0
        empty = EngineStats(self.num_slots, 0, 0, version, 0, 0, 0)
        return [self.seat_stats.get(worker_id, empty) for worker_id in range(self.next_id + JOIN_HEADROOM)]

    def worker_pid(self, index: int = 0) -> int:
        """The OS process of worker `index` (fault-injection tests kill it)."""
        import ray

        return ray.get(self.workers[index].pid.remote())

    def shutdown(self) -> None:
        import ray

        for worker in [*self.workers, *(joining.worker for joining in self.joining)]:
            ray.kill(worker)
        self.workers, self.worker_ids, self.joining = [], [], []
        self.node_of.clear()
        self.worker_of.clear()
        self.in_flight = InFlight()
        self.orphans = []
        if self.reservation is not None:
            self.reservation.drop()
            self.reservation = None
