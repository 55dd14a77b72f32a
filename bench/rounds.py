"""Rounds in turn on the product's rollout pipeline: what the rollout-only benches drive (no yaml, no Ray, so the
GPU evidence kit can import it too)."""
from __future__ import annotations

from typing import Any, Sequence


class RoundsInTurn:
    """Rounds taken one after another on the product's rollout pipeline at alpha 0, as a run's synchronous
    iterations take them (the weight sync's pause and resume with nothing in flight, then the round). For
    benches that time rollout only: the weights never change. The sync comes right before each round, so a
    round's `stats` count only its own work even when several of these share one worker, interleaved."""

    def __init__(self, rollout, settings, problems: Sequence[Any], make_requests, observe=None) -> None:
        from tailflow.engines.tail.pipeline import RolloutPipeline
        from tailflow.engines.tail.state import TailState

        self.pipeline = RolloutPipeline(rollout, settings, 0.0, False, problems, make_requests, observe)
        self.pipeline.start(TailState())
        self.num_taken = 0

    @property
    def tail(self):
        return self.pipeline.tail

    def take(self):
        """The next round, driven to its completion rule's end (a `TakenRound`)."""
        self.pipeline.pause()
        self.pipeline.resume(self.num_taken)
        taken = self.pipeline.take(self.num_taken)
        self.num_taken += 1
        return taken
