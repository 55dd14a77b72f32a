"""What watches a round while it runs: the protocol the pipeline shows every round's responses to.

Its own module so that both ends name it: the pipeline (pipeline.py) builds one per round when it launches it
(its `observe` hook) and hands it over in the `TakenRound` (taken.py). A run's observer is a `RoundWork`
(engines/round_work.py: the round's scorer and stream trainer step), the simulator's a `StreamedRound`
(engines/sim/streamed.py); a round nobody watches gets `Unobserved`.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from tailflow.engines.rollout.protocol import Completion

KeptGroups = Sequence[tuple[str, tuple[Completion, ...]]]


class RoundObserver(Protocol):
    """Sees one round as it runs: finished responses (finish order), then the prompts they completed."""

    @property
    def watches_each_response(self) -> bool:
        """False: the round may run as one batch call and nothing is shown until it ends."""

    def on_finished(self, completions: Sequence[Completion]) -> None: ...
    def on_completed(self, completed: KeptGroups) -> None: ...


class Unobserved:
    """The observer of a round nobody watches."""

    watches_each_response = False

    def on_finished(self, completions: Sequence[Completion]) -> None:
        pass

    def on_completed(self, completed: KeptGroups) -> None:
        pass
