"""A simulated replica whose weights change in the middle of a round (asynchronous training).

In async mode the trainer publishes version k+1 while the rollout pool is
still generating. A replica that holds requests when a version lands pauses
`sync_s` to load it, then either lets its in-flight requests continue under
the new weights (partial rollout) or aborts them and starts them again from
their prompt (restart; the tokens they had are lost and counted). A replica
with nothing in flight just takes the new version.

The engine runs in chunks of `chunk_steps` decode steps while a version is
still due, so a version lands at the first chunk boundary past its time
(late by at most one chunk). With nothing due it runs as `SimEngine` does,
step for step, which keeps alpha = 0 identical to the synchronous simulator.

Staleness is counted per response from the version of its first token:
`first_version` is set when a request is first admitted and reset when it
restarts (a KV preemption recomputes the same tokens, so it keeps its version).
"""
from __future__ import annotations

from dataclasses import dataclass

from tailflow.engines.sim.engine import Finished, SimEngine


@dataclass(frozen=True)
class WeightUpdate:
    time_s: float
    """Virtual time the trainer has published (and sent) this version."""
    version: int


class AsyncSimEngine(SimEngine):
    def __init__(self, *args, sync_s: float = 0.0, partial: bool = True, chunk_steps: int = 32, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sync_s = sync_s
        self.partial = partial
        self.chunk_steps = chunk_steps
        self.pending: list[WeightUpdate] = []
        self.first_version: dict[str, int] = {}
        self.num_tokens_restarted = 0
        self.num_restarts = 0
        self.num_pauses = 0

    def begin_round(self, version: int, pending: list[WeightUpdate]) -> None:
        """The round starts under `version`; `pending` land later, in time order."""
        self.weight_version = version
        self.pending = sorted(pending, key=lambda u: u.time_s)
        self.first_version.clear()

    def run(self, max_steps: int) -> list[Finished]:
        if not self.pending:
            return super().run(max_steps)
        finished: list[Finished] = []
        steps_left = max_steps
        self._land_due()
        while steps_left > 0 and self.has_unfinished():
            before = self.num_steps
            finished += super().run(min(steps_left, self.chunk_steps) if self.pending else steps_left)
            steps_left -= self.num_steps - before
            self._land_due()
            if self.num_steps == before:
                break
        return finished

    def _land_due(self) -> None:
        while self.pending and self.pending[0].time_s <= self.clock_s:
            update = self.pending.pop(0)
            if self.has_unfinished():
                self.num_pauses += 1
                self.clock_s += self.sync_s
                if not self.partial:
                    self._restart_in_flight()
            self.weight_version = update.version

    def _restart_in_flight(self) -> None:
        sequences = list(self.scheduler.running) + list(self.scheduler.waiting)
        partials = self.abort([seq.request_id for seq in sequences])
        self.num_tokens_restarted += sum(len(c.token_ids) for c in partials)
        self.num_restarts += len(partials)
        for seq in sequences:
            self.first_version.pop(seq.request_id, None)
        self.submit([seq.request for seq in sequences])

    def _admit(self) -> None:
        super()._admit()
        for seq in self.scheduler.running:
            self.first_version.setdefault(seq.request_id, self.weight_version)
