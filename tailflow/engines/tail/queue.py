"""The long-prompt queue: prompts a short round gave up on, waiting for a long round.

A short round aborts the prompts that did not finish in time (RollPacker, tail
batching); they wait here until a full batch of them has gathered, and the
next step is then a long round over the oldest of them. The queue holds
problem ids only, so it travels in `RunState` as plain JSON and a resumed run
looks the problems up again by id. Between iterations it is held, immutable,
in `TailState` (state.py); this class is the policy's working copy.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Sequence


@dataclass(frozen=True)
class QueuedPrompt:
    problem_id: str
    times_deferred: int
    """How many short rounds have aborted this prompt (more than 1 when it was
    drawn again, e.g. in a later epoch, and deferred again while queued)."""
    first_deferred_iteration: int
    """Iteration of the first deferral: the queue's FIFO order."""
    last_deferred_iteration: int


class LongPromptQueue:
    """Deferred prompts, oldest first, each problem id at most once.

    A prompt deferred while already queued keeps its place (its wait counts
    from the first deferral) and only its `times_deferred` grows, so a prompt
    is never trained twice from the queue.
    """

    def __init__(self, prompts: Iterable[QueuedPrompt] = ()) -> None:
        self._prompts: dict[str, QueuedPrompt] = {}
        """problem id -> record; dict insertion order is the FIFO order."""
        for prompt in prompts:
            if prompt.problem_id in self._prompts:
                raise ValueError(f"problem {prompt.problem_id!r} is queued twice")
            self._prompts[prompt.problem_id] = prompt

    def __len__(self) -> int:
        return len(self._prompts)

    def __contains__(self, problem_id: object) -> bool:
        return problem_id in self._prompts

    def defer(self, problem_ids: Sequence[str], iteration: int) -> None:
        """Queue these prompts (aborted in `iteration`); an id repeated in one call counts once."""
        for problem_id in dict.fromkeys(problem_ids):
            queued = self._prompts.get(problem_id)
            if queued is None:
                self._prompts[problem_id] = QueuedPrompt(problem_id, 1, iteration, iteration)
            else:
                self._prompts[problem_id] = replace(
                    queued, times_deferred=queued.times_deferred + 1, last_deferred_iteration=iteration
                )

    def oldest(self, k: int) -> list[QueuedPrompt]:
        """The (at most) k oldest prompts, left in the queue (for display and metrics)."""
        return list(self._prompts.values())[: max(k, 0)]

    def take_oldest(self, n: int) -> list[QueuedPrompt]:
        """Remove and return the (at most) n oldest prompts: the caller now owns them."""
        if n < 0:
            raise ValueError(f"cannot take {n} prompts")
        taken = self.oldest(n)
        for prompt in taken:
            del self._prompts[prompt.problem_id]
        return taken

    def prompts(self) -> list[QueuedPrompt]:
        """Every queued prompt, oldest first (what `TailState.queue` holds)."""
        return list(self._prompts.values())
