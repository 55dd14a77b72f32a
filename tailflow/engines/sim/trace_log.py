"""A run's `rollout_trace.jsonl` in the artifact store (local or S3): appended each iteration, read by `plan`.

A row is written when the iteration's rollout ends, before the iteration
commits; an iteration that is run again (an actor died) appends its row
again, so readers keep the last row of each iteration, and a resumed run drops
rows past its commit, as the metrics log does.
"""
from __future__ import annotations

from tailflow.engines.runs.layout import rollout_trace_key
from tailflow.engines.sim.trace import TraceRound, parse_trace
from tailflow.engines.store import ArtifactStore


class RolloutTraceLog:
    def __init__(self, store: ArtifactStore, run_id: str) -> None:
        self.store = store
        self.key = rollout_trace_key(run_id)

    def append(self, trace_round: TraceRound) -> None:
        self.store.append_line(self.key, trace_round.to_line())

    def rounds(self) -> list[TraceRound]:
        """Every iteration's last row, in iteration order (FileNotFoundError when the run wrote none)."""
        text = self.store.read_text(self.key)
        last = {r.iteration: r for r in parse_trace(text, self.store.uri(self.key))}
        return [last[iteration] for iteration in sorted(last)]

    def keep_committed(self, num_iterations: int) -> None:
        """On resume: drop rows of iterations >= `num_iterations` (rolled out, never committed)."""
        if not self.store.exists(self.key):
            return
        kept = [r for r in self.rounds() if r.iteration < num_iterations]
        self.store.write_text(self.key, "".join(r.to_line() + "\n" for r in kept))
