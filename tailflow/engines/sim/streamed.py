"""Work that streams while a round rolls out, as the product runs it: scoring every response as soon as it
finishes (`reward.streaming`, on the reward workers) and training every group as soon as its prompt completes
and is scored (`train.stream`, engines/train/stream.py).

The simulated round's observer (the pipeline's `observe` hook, the one a run's
streamed scorer uses) notes the group clock when the pipeline shows it a
finished response or a completed prompt (at the poll that saw it, as the
product sees it). Afterwards `drain` queues the work: responses in finish
order on the reward workers, each taking the per-response reward time times
the workers (so a whole round scored after rollout takes the step's reward
time, as before); groups in completion order on the trainer, each ready when
its prompt completed and its kept responses were scored, each an FSDP pass of
its own (it regathers the weights: `TrainerCost.train_s` of its tokens), in the order they
are ready.
"""
from __future__ import annotations

import heapq
from typing import Callable, Sequence

from tailflow.engines.rollout.protocol import Completion


def drain(arrivals: Sequence[float], service_s: Sequence[float], num_servers: int,
          free_at: float = 0.0) -> list[float]:
    """When each job ends: jobs in order, arriving at `arrivals`, each taking `service_s` on the first of
    `num_servers` servers free (all free from `free_at`)."""
    servers = [free_at] * num_servers
    done = []
    for arrival, service in zip(arrivals, service_s):
        start = max(heapq.heappop(servers), arrival)
        done.append(start + service)
        heapq.heappush(servers, done[-1])
    return done


class StreamedRound:
    """A simulated round's observer: when each response finished and each prompt completed, on `clock`."""

    watches_each_response = True

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.finished: list[tuple[float, Completion]] = []
        self.completed: list[tuple[float, tuple[Completion, ...]]] = []

    def on_finished(self, completions: Sequence[Completion]) -> None:
        now = self.clock()
        self.finished += [(now, c) for c in completions]

    def on_completed(self, completed) -> None:
        now = self.clock()
        self.completed += [(now, kept) for _, kept in completed]

    def scored_at(self, reward_s: Callable[[Completion], float], num_workers: int) -> dict[str, float]:
        """Request id -> when its score is ready, the finished responses scored in finish order."""
        done = drain([t for t, _ in self.finished], [reward_s(c) * num_workers for _, c in self.finished],
                     num_workers)
        return {c.request_id: end for (_, c), end in zip(self.finished, done)}

    def trained_at(self, scored: dict[str, float], train_s: Callable[[Sequence[Completion]], float],
                   free_at: float) -> float:
        """When the trainer has trained every completed group, each once it is complete and scored."""
        ready = [max([t] + [scored.get(c.request_id, t) for c in kept]) for t, kept in self.completed]
        order = sorted(range(len(ready)), key=ready.__getitem__)
        done = drain([ready[i] for i in order], [train_s(self.completed[i][1]) for i in order], 1, free_at)
        return max(done, default=free_at)
