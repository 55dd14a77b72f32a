"""Several simulated replicas driven the way `RolloutGroup` drives its Ray workers.

Same placement (a streamed request goes to the replica with the fewest in
flight, lowest index on ties; a batch is dealt round-robin), same calls
(`generate`, `submit`, `poll`, `abort`, `load_weights`), so the product's
rollout pipeline drives it unchanged. Time is what the driver makes it: a
`poll` runs `max_steps` steps on every busy replica side by side and returns
when the slowest is done (the group clock moves to the latest replica clock;
the others wait), and `generate` ends when the last replica goes idle.
Completions are merged by engine step, as the real group merges them, so no
replica is favoured by its index. What happens off the rollout (scoring,
training, a weight transfer) moves the clock by `wait_until`.
"""
from __future__ import annotations

from typing import Callable, Sequence

from tailflow.engines.cluster.rollout_group import share_by_load, take_by_worker
from tailflow.engines.rollout.protocol import Completion, EngineStats, Request
from tailflow.engines.sim.engine import UNLIMITED, Finished, SimEngine


class SimGroup:
    def __init__(self, make_engine: Callable[[int], SimEngine], num_replicas: int) -> None:
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        self.engines = [make_engine(rank) for rank in range(num_replicas)]
        self.clock_s = 0.0
        self.worker_of: dict[str, int] = {}
        self.finish_steps: dict[str, tuple[int, int]] = {}
        """This round's finished request id -> (replica, step of the round it finished at), as `RolloutGroup`."""
        self.round_start = [0] * num_replicas

    @classmethod
    def of(cls, cost, lengths, num_replicas: int, num_slots: int, kv_budget_tokens: int | None = None,
           seed: int = 0) -> "SimGroup":
        """`num_replicas` engines on one cost model and length source, each at its own pace (the cost model's
        `replica_slowdowns`: stragglers; `seed` draws which replica is slow)."""
        slowdowns = cost.replica_slowdowns(num_replicas, seed)
        return cls(lambda rank: SimEngine(cost, lengths, num_slots, kv_budget_tokens, slowdown=slowdowns[rank]),
                   num_replicas)

    def _start_round(self) -> None:
        self.finish_steps.clear()
        self.round_start = [engine.num_steps for engine in self.engines]

    def _start_all(self) -> None:
        """Every replica starts the next call at the group's time (idle ones have waited for it)."""
        for engine in self.engines:
            engine.clock_s = max(engine.clock_s, self.clock_s)

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        """Run all to completion, dealt round-robin; completions in request order (as `RolloutGroup`)."""
        self._start_all()
        self._start_round()
        by_id: dict[str, Completion] = {}
        for rank, engine in enumerate(self.engines):
            share = list(requests[rank :: len(self.engines)])
            if share:
                engine.submit(share)
                for record in engine.run(UNLIMITED):
                    by_id[record.completion.request_id] = record.completion
                    self.finish_steps[record.completion.request_id] = (rank, record.step - self.round_start[rank])
        self.clock_s = max(engine.clock_s for engine in self.engines)
        return [by_id[request.request_id] for request in requests]

    def submit(self, requests: Sequence[Request]) -> None:
        if not self.worker_of:
            self._start_round()
        shares = share_by_load(requests, self.in_flight_per_worker(), self.worker_of)
        for engine, share in zip(self.engines, shares):
            if share:
                engine.submit(share)

    def poll(self, max_steps: int) -> list[Completion]:
        """Up to `max_steps` steps on every busy replica; what finished, by engine step then replica."""
        self._start_all()
        tagged: list[tuple[int, int, int, Finished]] = []
        for rank, engine in enumerate(self.engines):
            if engine.has_unfinished():
                start = engine.num_steps
                tagged += [(f.step - start, rank, i, f) for i, f in enumerate(engine.run(max_steps))]
        self.clock_s = max(engine.clock_s for engine in self.engines)
        tagged.sort(key=lambda item: item[:3])
        for _, rank, _, record in tagged:
            self.worker_of.pop(record.completion.request_id, None)
            self.finish_steps[record.completion.request_id] = (rank, record.step - self.round_start[rank])
        return [record.completion for *_, record in tagged]

    def abort(self, request_ids: Sequence[str]) -> list[Completion]:
        return [c for rank, ids in take_by_worker(request_ids, self.worker_of) for c in self.engines[rank].abort(ids)]

    def load_weights(self, version: int) -> None:
        """Every replica takes weight `version` (refused while a request is in flight, as the real engines)."""
        for engine in self.engines:
            engine.load_weights({}, version)

    def wait_until(self, time_s: float) -> None:
        """The replicas idle until `time_s` (the trainer's work, a weight transfer): the next call starts there."""
        self.clock_s = max(self.clock_s, time_s)

    def has_unfinished(self) -> bool:
        return any(engine.has_unfinished() for engine in self.engines)

    def in_flight_per_worker(self) -> list[int]:
        loads = [0] * len(self.engines)
        for rank in self.worker_of.values():
            loads[rank] += 1
        return loads

    def stats(self) -> list[EngineStats]:
        return [engine.stats() for engine in self.engines]

    @property
    def num_preemptions(self) -> int:
        return sum(engine.num_preemptions for engine in self.engines)
