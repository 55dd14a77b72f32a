"""The rollout workers of a run: Ray actors that each host one engine.

Two ways to drive them. `generate` runs a batch to completion (the
synchronous baseline). `submit` / `poll` / `abort` stream: each request goes
to the worker with the fewest in flight (lowest index on ties), `poll` runs a
few engine steps on every busy worker and returns what finished merged by
engine step (the i-th step of every worker before any worker's next). Nothing depends on wall-clock timing, so with one worker a seeded
run is reproducible bit for bit.
"""
from __future__ import annotations

from typing import Sequence

from tailflow.engines.cluster.calls import get_all
from tailflow.engines.rollout.protocol import Completion, EngineStats, Request


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
                 sleep_mode: bool = False, actor_options: Sequence[dict] | None = None):
        """`actor_options[w]`, when given, places worker w (`placement.actor_options`: its placement-group bundle
        and share of it) instead of `num_cpus` / `num_gpus`; `engine`, `device` and `sleep_mode` (vLLM's, for
        colocated GPUs) reach each worker's `build_engine`."""
        import ray

        from tailflow.engines.rollout.worker import RolloutWorker

        actor_class = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0)(RolloutWorker)
        options = list(actor_options) if actor_options is not None else [{}] * num_workers
        if len(options) != num_workers:
            raise ValueError(f"{len(options)} actor options for {num_workers} rollout workers")
        self.workers = [
            actor_class.options(**options[rank]).remote(model_path, num_slots, max_seq_len, seed + rank * 1_000_003,
                                                        num_threads, device, engine, sleep_mode)
            for rank in range(num_workers)
        ]
        self.worker_of: dict[str, int] = {}
        """In-flight request id -> index of the worker running it."""
        self.finish_steps: dict[str, tuple[int, int]] = {}
        """This round's finished request id -> (worker, step of the round it finished at), for traces."""

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        """Run all requests to completion; completions come back in request order."""
        self.finish_steps.clear()
        shares = [list(requests[rank :: len(self.workers)]) for rank in range(len(self.workers))]
        ranks = [rank for rank, share in enumerate(shares) if share]
        results = get_all([self.workers[rank].generate_tagged.remote(shares[rank]) for rank in ranks])
        by_id = {}
        for rank, result in zip(ranks, results):
            for tagged in result:
                by_id[tagged.completion.request_id] = tagged.completion
                self.finish_steps[tagged.completion.request_id] = (rank, tagged.step)
        return [by_id[request.request_id] for request in requests]

    def submit(self, requests: Sequence[Request]) -> None:
        if not self.worker_of:
            self.finish_steps.clear()  # a new round
        shares = share_by_load(requests, self.in_flight_per_worker(), self.worker_of)
        get_all([self.workers[rank].submit.remote(share) for rank, share in enumerate(shares) if share])

    def poll(self, max_steps: int) -> list[Completion]:
        """Up to `max_steps` engine steps on every busy worker; finished completions merged by engine step
        (the i-th step of every worker before the (i+1)-th of any), then worker: merging worker by worker
        would let worker 0's whole poll finish "first" and favour it in the completion rule."""
        busy = [rank for rank, load in enumerate(self.in_flight_per_worker()) if load]
        results = get_all([self.workers[rank].step_many_tagged.remote(max_steps) for rank in busy])
        tagged = sorted(((f.offset, rank, index, f) for rank, result in zip(busy, results)
                         for index, f in enumerate(result)), key=lambda item: item[:3])
        for _, rank, _, f in tagged:
            self.worker_of.pop(f.completion.request_id, None)
            self.finish_steps[f.completion.request_id] = (rank, f.step)
        return [f.completion for *_, f in tagged]

    def abort(self, request_ids: Sequence[str]) -> list[Completion]:
        """Abort in-flight requests (unknown or finished ids are ignored); their partial completions."""
        by_rank = take_by_worker(request_ids, self.worker_of)
        results = get_all([self.workers[rank].abort.remote(ids) for rank, ids in by_rank])
        return [completion for result in results for completion in result]

    def has_unfinished(self) -> bool:
        """Any engine still holds a request; asked only when a poll returned nothing (one extra round trip)."""
        return any(get_all([worker.has_unfinished.remote() for worker in self.workers]))

    def in_flight_per_worker(self) -> list[int]:
        loads = [0] * len(self.workers)
        for rank in self.worker_of.values():
            loads[rank] += 1
        return loads

    def load_weights(self, state_dict: dict, version: int) -> None:
        """Every worker loads these weights (put once into the object store) before any new request."""
        import ray

        self.load_weights_ref(ray.put(state_dict), version)

    def load_weights_ref(self, state_dict_ref, version: int) -> None:
        """The same from a state dict already in the object store (`weight_sync.py`: no copy via the driver)."""
        get_all([worker.load_weights.remote(state_dict_ref, version) for worker in self.workers])

    def sleep(self) -> None:
        """Every engine frees its GPU memory for the trainer (vLLM's sleep; the native engine keeps it)."""
        get_all([worker.sleep.remote() for worker in self.workers])

    def wake_up(self) -> None:
        """Every engine takes its memory back (after weights were loaded); a no-op for awake engines."""
        get_all([worker.wake_up.remote() for worker in self.workers])

    def stats(self) -> list[EngineStats]:
        return get_all([worker.stats.remote() for worker in self.workers])

    def worker_pid(self, index: int = 0) -> int:
        """The OS process of worker `index` (fault-injection tests kill it)."""
        import ray

        return ray.get(self.workers[index].pid.remote())

    def shutdown(self) -> None:
        import ray

        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
        self.worker_of.clear()
