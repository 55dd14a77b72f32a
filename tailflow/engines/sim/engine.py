"""The simulated rollout engine: the native engine's protocol on a virtual clock.

It speaks `RolloutEngine` (submit, step, abort, has_unfinished, load_weights,
stats) plus the `generate` / `poll` a worker offers, so `run_round` drives it
unchanged. Each request's response length comes from a `LengthSource`; each
step admits, prefills and decodes exactly as the native engine does (the same
scheduler, see sim_scheduler.py) and advances the clock by a cost model.

Steps in which nothing finishes, is admitted or is preempted change nothing
but the clock, so the engine jumps over them in one cost-model call: a round
of 32k steps on 32 replicas costs events, not steps. Completions carry
placeholder tokens of the right length (the simulator knows lengths, not
tokens), which is all the completion rule and the waste accounting read.
"""
from __future__ import annotations

import sys
from collections import abc
from dataclasses import dataclass
from typing import Mapping, Sequence as Seq

from tailflow.engines.rollout.protocol import Completion, EngineStats, FinishReason, Request
from tailflow.engines.sim.costs import CostModel
from tailflow.engines.sim.lengths import LengthSource
from tailflow.engines.sim.sim_scheduler import SimScheduler, SimSequence

UNLIMITED = sys.maxsize


class PlaceholderTokens(abc.Sequence):
    """`n` zeros standing for tokens the simulator never produces, stored as one integer.

    `len()` is the response length, which is all the completion rule and the waste accounting read;
    indexing gives zeros. A simulated round holds thousands of responses of up to 32k tokens.
    """

    __slots__ = ("_length",)

    def __init__(self, length: int) -> None:
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):
        if isinstance(index, slice):
            return PlaceholderTokens(len(range(*index.indices(self._length))))
        if not -self._length <= index < self._length:
            raise IndexError(index)
        return 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlaceholderTokens) and other._length == self._length

    def __hash__(self) -> int:
        return hash(("placeholder", self._length))

    def __repr__(self) -> str:
        return f"PlaceholderTokens({self._length})"


@dataclass(frozen=True)
class Finished:
    completion: Completion
    step: int
    """The engine's decode-step count when it finished (the native engine's `stats().steps` then)."""
    time_s: float
    """Virtual time at the end of that step."""


class SimEngine:
    def __init__(self, cost: CostModel, lengths: LengthSource, num_slots: int, kv_budget_tokens: int | None = None,
                 max_seq_len: int | None = None, weight_version: int = 0) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.cost = cost
        self.lengths = lengths
        self.num_slots = num_slots
        self.kv_budget_tokens = UNLIMITED if kv_budget_tokens is None else kv_budget_tokens
        self.max_seq_len = max_seq_len
        self.scheduler = SimScheduler(num_slots, self.kv_budget_tokens)
        self.weight_version = weight_version
        self.clock_s = 0.0
        self.kv_used_tokens = 0
        """Cached positions of the running rows (their prompts and generated tokens)."""
        self.num_steps = 0
        self.num_busy_slot_steps = 0
        self.num_tokens_generated = 0
        self.num_preemptions = 0
        self.busy_s = 0.0
        """Clock time spent prefilling and decoding (the rest of the clock is waiting for the other replicas)."""

    # ---- requests in -------------------------------------------------------------------------

    def submit(self, requests: Seq[Request]) -> None:
        self.scheduler.check_new(requests, self._validate)
        for request in requests:
            target = self.lengths.length_of(request)
            if not 1 <= target.num_tokens <= request.params.max_new_tokens:
                raise ValueError(f"request {request.request_id!r}: length source gave {target.num_tokens} tokens, "
                                 f"outside 1..max_new_tokens ({request.params.max_new_tokens})")
            self.scheduler.add(SimSequence(request, target))

    def _validate(self, request: Request, seen: set[str]) -> None:
        rid, needed = request.request_id, len(request.prompt_token_ids) + request.params.max_new_tokens
        if rid in seen:
            raise ValueError(f"request {rid!r}: duplicate request id (already in flight or twice in this call)")
        if not request.prompt_token_ids:
            raise ValueError(f"request {rid!r}: empty prompt")
        if self.max_seq_len is not None and needed > self.max_seq_len:
            raise ValueError(f"request {rid!r}: prompt + max_new_tokens = {needed} exceeds max_seq_len {self.max_seq_len}")
        if needed + 1 > self.kv_budget_tokens:
            raise ValueError(f"request {rid!r}: prompt + max_new_tokens = {needed} tokens can never fit the KV budget "
                             f"of {self.kv_budget_tokens} tokens (raise TP)")

    # ---- the loop ----------------------------------------------------------------------------

    def step(self) -> list[Completion]:
        return [f.completion for f in self.run(1)]

    def step_many(self, max_steps: int) -> list[Completion]:
        return [f.completion for f in self.run(max_steps)]

    poll = step_many
    """The name `tailflow.engines.tail.driver.StreamingRollout` uses."""

    def generate(self, requests: Seq[Request]) -> list[Completion]:
        self.submit(requests)
        return [f.completion for f in self.run(UNLIMITED)]

    def run(self, max_steps: int) -> list[Finished]:
        """Up to `max_steps` decode steps (fewer if the engine goes idle); what finished, in finish order."""
        finished: list[Finished] = []
        steps_left = max_steps
        while steps_left > 0 and self.has_unfinished():
            self._admit()
            running = self.scheduler.running
            if not running:
                break
            while self.kv_used_tokens + len(running) > self.kv_budget_tokens:
                self._preempt()
            num_rows = len(running)
            jump = min(steps_left, min(seq.num_remaining for seq in running),
                       (self.kv_budget_tokens - self.kv_used_tokens) // num_rows)
            longest = max(seq.num_cached for seq in running)
            self._charge(self.cost.decode_span_s(num_rows, self.kv_used_tokens, longest, jump))
            for seq in running:
                seq.num_generated += jump
            self.kv_used_tokens += num_rows * jump
            self.num_steps += jump
            self.num_busy_slot_steps += num_rows * jump
            self.num_tokens_generated += num_rows * jump
            steps_left -= jump
            finished += self._finish([seq for seq in running if seq.num_remaining == 0])
        return finished

    def _admit(self) -> None:
        admitted = self.scheduler.admit(self.kv_used_tokens)
        if admitted:
            tokens = sum(seq.num_cached - 1 for seq in admitted)  # decode feeds each one's last token
            self._charge(self.cost.prefill_s(tokens, len(admitted)))
            self.kv_used_tokens += sum(seq.num_cached for seq in admitted)

    def _charge(self, seconds: float) -> None:
        self.clock_s += seconds
        self.busy_s += seconds

    def _preempt(self) -> None:
        if len(self.scheduler.running) == 1:
            raise RuntimeError("one request alone overflows the KV budget (refused at submit; a bug)")
        victim = self.scheduler.preempt_newest()
        self.kv_used_tokens -= victim.num_cached
        self.num_preemptions += 1

    def _finish(self, done: list[SimSequence]) -> list[Finished]:
        records = []
        for seq in done:
            self.kv_used_tokens -= seq.num_cached
            records.append(Finished(self._completion(seq, seq.target.finish_reason), self.num_steps, self.clock_s))
        self.scheduler.release(done)
        return records

    def _completion(self, seq: SimSequence, reason: FinishReason) -> Completion:
        tokens = PlaceholderTokens(seq.num_generated)
        return seq.request.completion(tokens, tokens, reason, self.weight_version)

    # ---- control -----------------------------------------------------------------------------

    def abort(self, request_ids: Seq[str]) -> list[Completion]:
        """As the native engine: stop these now, free their slots; partials (ABORT) in the order asked."""
        wanted = set(request_ids)
        stopped = {seq.request_id: seq for seq in self.scheduler.remove_waiting(wanted)}
        running = [seq for seq in self.scheduler.running if seq.request_id in wanted]
        self.kv_used_tokens -= sum(seq.num_cached for seq in running)
        self.scheduler.release(running)
        stopped.update((seq.request_id, seq) for seq in running)
        return [self._completion(stopped[rid], FinishReason.ABORT) for rid in dict.fromkeys(request_ids)
                if rid in stopped]

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def load_weights(self, state_dict: Mapping[str, object], version: int) -> None:
        """No weights to hold: only the version moves (refused while in flight, as the native engine)."""
        if self.has_unfinished():
            raise RuntimeError(f"load_weights(version={version}) refused: requests are in flight")
        self.weight_version = version

    def stats(self) -> EngineStats:
        return EngineStats(num_slots=self.num_slots, num_running=len(self.scheduler.running),
                           num_waiting=len(self.scheduler.waiting), weight_version=self.weight_version,
                           steps=self.num_steps, busy_slot_steps=self.num_busy_slot_steps,
                           tokens_generated=self.num_tokens_generated)
