"""The simulated rollout engine: the native engine's protocol on a virtual clock.

It speaks `RolloutEngine` (submit, step, abort, has_unfinished, load_weights,
stats) plus the `generate` a worker offers; `SimGroup` drives its replicas
through `run`, so the rollout pipeline drives them unchanged. Each request's
response length comes from a `LengthSource`; each step admits, prefills and
decodes exactly as the native engine does (the same scheduler, see
sim_scheduler.py) and advances the clock by a cost model.

Steps in which nothing finishes, is admitted or is preempted change nothing
but the clock, so the engine jumps over them in one cost-model call: a round
of 32k steps on 32 replicas costs events, not steps. Completions carry
placeholder tokens of the right length (the simulator knows lengths, not
tokens), which is all the completion rule and the waste accounting read.
"""
from __future__ import annotations

import heapq
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence as Seq

from tailflow.engines.rollout.protocol import Completion, EngineStats, FinishReason, Request
from tailflow.engines.rollout.sequence import SequenceStatus
from tailflow.engines.sim.costs import CostModel, Infeasible
from tailflow.engines.sim.lengths import RequestLengths
from tailflow.engines.sim.placeholder import PlaceholderTokens, VersionRuns
from tailflow.engines.sim.sim_scheduler import SimScheduler, SimSequence

UNLIMITED = sys.maxsize


@dataclass(frozen=True)
class Finished:
    completion: Completion
    step: int
    """The engine's decode-step count when it finished (the native engine's `stats().steps` then)."""
    time_s: float
    """Virtual time at the end of that step."""


class SimEngine:
    def __init__(self, cost: CostModel, lengths: RequestLengths, num_slots: int, kv_budget_tokens: int | None = None,
                 slowdown: float = 1.0) -> None:
        """`slowdown`: this replica's time multiplier (its slowest GPU, `stragglers.py`)."""
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.cost = cost
        self.lengths = lengths
        self.slowdown = slowdown
        self.num_slots = num_slots
        self.kv_budget_tokens = UNLIMITED if kv_budget_tokens is None else kv_budget_tokens
        self.scheduler = SimScheduler(num_slots, self.kv_budget_tokens)
        self.weight_version = 0
        self.clock_s = 0.0
        self.kv_used_tokens = 0
        """Cached positions of the running rows (their prompts and generated tokens)."""
        self.num_steps = 0
        self.num_tokens_generated = 0
        self.num_preemptions = 0
        self.busy_s = 0.0
        """Clock time spent prefilling and decoding (the rest of the clock is waiting for the other replicas)."""
        self._finishing: list[tuple[int, int, SimSequence]] = []
        """Heap of (engine step it finishes at, admission, row) of the running rows (and stale entries)."""
        self._longest, self._longest_step = 0, 0

    # ---- requests in -------------------------------------------------------------------------

    def submit(self, requests: Seq[Request]) -> None:
        self.scheduler.check_new(requests, self._validate)
        for request in requests:
            target = self.lengths.length_of(request)
            if not 1 <= target.num_tokens <= request.params.max_new_tokens:
                raise ValueError(f"request {request.request_id!r}: length source gave {target.num_tokens} tokens, "
                                 f"outside 1..max_new_tokens ({request.params.max_new_tokens})")
            had = len(request.prefix.token_ids) if request.prefix else 0
            if had >= target.num_tokens:
                raise ValueError(f"request {request.request_id!r}: its prefix of {had} tokens already reaches its "
                                 f"length ({target.num_tokens}): a finished response is never continued")
            self.scheduler.add(SimSequence(request, target))

    def _validate(self, request: Request, seen: set[str]) -> None:
        rid, needed = request.request_id, len(request.prompt_token_ids) + request.params.max_new_tokens
        if rid in seen:
            raise ValueError(f"request {rid!r}: duplicate request id (already in flight or twice in this call)")
        if not request.prompt_token_ids:
            raise ValueError(f"request {rid!r}: empty prompt")
        if needed + 1 > self.kv_budget_tokens:
            raise Infeasible(f"request {rid!r}: prompt + max_new_tokens = {needed} tokens can never fit the KV budget "
                             f"of {self.kv_budget_tokens:,} tokens (raise TP)")

    # ---- the loop ----------------------------------------------------------------------------

    def step(self) -> list[Completion]:
        return [f.completion for f in self.run(1)]

    def generate(self, requests: Seq[Request]) -> list[Completion]:
        self.submit(requests)
        return [f.completion for f in self.run(UNLIMITED)]

    def run(self, max_steps: int) -> list[Finished]:
        """Up to `max_steps` decode steps (fewer if the engine goes idle); what finished, in finish order.

        Between events (a row finishes, is admitted or preempted) every running row gains one token a step, so
        a span costs O(1): rows' counts are brought up to date only when an event needs them (`_sync`)."""
        finished: list[Finished] = []
        steps_left = max_steps
        while steps_left > 0 and self.has_unfinished():
            self._admit()
            running = self.scheduler.running
            if not running:
                break
            if self.kv_used_tokens + len(running) > self.kv_budget_tokens:
                self._sync()
                while self.kv_used_tokens + len(running) > self.kv_budget_tokens:
                    self._preempt()
            num_rows = len(running)
            to_finish = self._next_finish_step() - self.num_steps
            jump = min(steps_left, to_finish, (self.kv_budget_tokens - self.kv_used_tokens) // num_rows)
            longest = self._longest + self.num_steps - self._longest_step
            self._charge(self.cost.decode_span_s(num_rows, self.kv_used_tokens, longest, jump))
            self.kv_used_tokens += num_rows * jump
            self.num_steps += jump
            self.num_tokens_generated += num_rows * jump
            steps_left -= jump
            if jump == to_finish:
                self._sync()
                finished += self._finish([seq for seq in running if seq.num_remaining == 0])
        return finished

    def _sync(self) -> None:
        """Bring every running row's token count up to the engine's step."""
        for seq in self.scheduler.running:
            seq.num_generated += self.num_steps - seq.synced_step
            seq.synced_step = self.num_steps

    def _next_finish_step(self) -> int:
        """The engine step at which the first running row finishes (stale heap entries are dropped)."""
        heap = self._finishing
        while True:
            step, admission, seq = heap[0]
            if seq.status is SequenceStatus.RUNNING and seq.admission == admission:
                return step
            heapq.heappop(heap)

    def _reset_longest(self) -> None:
        """After the running set changed (rows synced): the longest context, and the step it was taken at."""
        self._longest = max((seq.num_cached for seq in self.scheduler.running), default=0)
        self._longest_step = self.num_steps

    def _admit(self) -> None:
        admitted = self.scheduler.admit(self.kv_used_tokens)
        if admitted:
            tokens = sum(seq.num_cached - 1 for seq in admitted)  # decode feeds each one's last token
            self._charge(self.cost.prefill_s(tokens, len(admitted)))
            self.kv_used_tokens += sum(seq.num_cached for seq in admitted)
            for seq in admitted:
                seq.synced_step = self.num_steps
                heapq.heappush(self._finishing, (self.num_steps + seq.num_remaining, seq.admission, seq))
            self._longest = max(self._longest + self.num_steps - self._longest_step,
                                max(seq.num_cached for seq in admitted))
            self._longest_step = self.num_steps

    def _charge(self, seconds: float) -> None:
        seconds *= self.slowdown
        self.clock_s += seconds
        self.busy_s += seconds

    def _preempt(self) -> None:
        """The newest running row leaves (rows synced); it waits at the front of the queue to be recomputed."""
        if len(self.scheduler.running) == 1:
            raise RuntimeError("one request alone overflows the KV budget (refused at submit; a bug)")
        victim = self.scheduler.preempt_newest()
        self.kv_used_tokens -= victim.num_cached
        self.num_preemptions += 1
        self._reset_longest()

    def _finish(self, done: list[SimSequence]) -> list[Finished]:
        records = []
        for seq in done:
            self.kv_used_tokens -= seq.num_cached
            records.append(Finished(self._completion(seq, seq.target.finish_reason), self.num_steps, self.clock_s))
        self.scheduler.release(done)
        self._reset_longest()
        return records

    def _completion(self, seq: SimSequence, reason: FinishReason) -> Completion:
        """What `seq.request.completion` builds, with compact sequences (`placeholder.py`): it would copy them
        into tuples of one entry per token. A continued response names each token's version, as the native
        engine's do, when they differ."""
        request, tokens = seq.request, PlaceholderTokens(seq.num_generated)
        versions = VersionRuns(())
        if request.prefix is not None:
            versions = VersionRuns.of(request.prefix.weight_versions).then(
                self.weight_version, seq.num_generated - len(request.prefix.token_ids))
        mixed = any(version != self.weight_version for version, _ in versions.runs)
        return Completion(request.request_id, request.prompt_token_ids, tokens, tokens, reason, self.weight_version,
                          versions if mixed else (), request.problem_id, request.index)

    # ---- control -----------------------------------------------------------------------------

    def abort(self, request_ids: Seq[str]) -> list[Completion]:
        """As the native engine: stop these now, free their slots; partials (ABORT) in the order asked."""
        wanted = set(request_ids)
        self._sync()
        stopped = {seq.request_id: seq for seq in self.scheduler.remove_waiting(wanted)}
        running = [seq for seq in self.scheduler.running if seq.request_id in wanted]
        self.kv_used_tokens -= sum(seq.num_cached for seq in running)
        self.scheduler.release(running)
        self._reset_longest()
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
                           steps=self.num_steps, busy_slot_steps=self.num_tokens_generated,
                           tokens_generated=self.num_tokens_generated)  # a busy slot makes one token a step
