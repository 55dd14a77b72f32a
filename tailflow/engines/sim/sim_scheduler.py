"""The native engine's scheduler with a KV-cache budget: admission stops when memory is full, and the
newest running request is preempted (recomputed later) when a decode step would overflow it.

With an unlimited budget this is exactly `rollout.scheduler.Scheduler` (same FIFO admission, same
row order within an admission, same packing on release), which is what lets the simulated engine
finish requests in the native engine's order. The budget part follows vLLM: a preempted request
goes back to the front of the queue and, readmitted, recomputes its prompt and the tokens it had.
"""
from __future__ import annotations

from tailflow.engines.rollout.protocol import Request
from tailflow.engines.rollout.scheduler import Scheduler
from tailflow.engines.rollout.sequence import SequenceStatus
from tailflow.engines.sim.lengths import ResponseLength


class SimSequence:
    """A request, its known final length, and how far it has got (the fields `Scheduler` reads)."""

    def __init__(self, request: Request, target: ResponseLength) -> None:
        self.request = request
        self.request_id = request.request_id
        self.target = target
        self.status = SequenceStatus.WAITING
        self.num_generated = len(request.prefix.token_ids) if request.prefix else 0
        """Tokens the response has, a continued request's prefix included (admission prefills them again)."""
        self.admission = -1
        """Order of its latest admission: the preemption victim is the newest."""
        self.num_prompt_tokens = len(request.prompt_token_ids)
        self.synced_step = 0
        """The engine step `num_generated` was brought up to (running rows gain a token a step; the engine adds
        them when something reads them, not every step)."""

    @property
    def num_cached(self) -> int:
        """Positions in the KV cache: the prompt and the tokens generated so far (what a row move copies)."""
        return self.num_prompt_tokens + self.num_generated

    @property
    def num_remaining(self) -> int:
        return self.target.num_tokens - self.num_generated


class SimScheduler(Scheduler):
    def __init__(self, num_slots: int, kv_budget_tokens: int) -> None:
        super().__init__(num_slots)
        self.kv_budget_tokens = kv_budget_tokens
        self.num_admissions = 0

    def admit(self, kv_used_tokens: int = 0) -> list[SimSequence]:
        """FIFO into free slots while the sequence's cache (+1 position for its next token) fits the budget."""
        admitted = []
        while self.waiting and len(self.running) + len(admitted) < self.num_slots:
            need = self.waiting[0].num_cached + 1
            if kv_used_tokens + need > self.kv_budget_tokens:
                break
            seq = self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            seq.admission = self.num_admissions
            self.num_admissions += 1
            kv_used_tokens += seq.num_cached
            admitted.append(seq)
        admitted.sort(key=lambda seq: seq.num_cached)  # prompt and any prefix, as the native scheduler
        self.running.extend(admitted)
        return admitted

    def preempt_newest(self) -> SimSequence:
        """Take the most recently admitted running sequence out; it waits at the front of the queue."""
        victim = max(self.running, key=lambda seq: seq.admission)
        self.release([victim])
        victim.status = SequenceStatus.WAITING
        self.waiting.appendleft(victim)
        return victim
