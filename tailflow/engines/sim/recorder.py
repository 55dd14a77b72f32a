"""Record a round's trace by standing between the round driver and the rollout.

`TraceRecorder` speaks the driver's `StreamingRollout` (generate, submit, poll,
abort, has_unfinished, stats) and passes every call through, keeping each completion
and each aborted partial it sees; `round_trace` then writes the round down
with the finish steps the rollout kept (`finish_steps`: request id ->
(worker, engine step), which `RolloutGroup`, an in-process `RolloutWorker`
and `SimGroup` all keep). The driver and the policy are not touched.
"""
from __future__ import annotations

from typing import Sequence

from tailflow.engines.reward.scoring import problem_id_of
from tailflow.engines.rollout.protocol import Completion, Request
from tailflow.engines.sim.trace import TracePrompt, TraceResponse, TraceRound
from tailflow.engines.tail.completion import RoundResult


class TraceRecorder:
    def __init__(self, rollout) -> None:
        self.rollout = rollout
        self.finished: dict[str, Completion] = {}
        self.aborted: dict[str, Completion] = {}

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        completions = self.rollout.generate(requests)
        self.finished.update((c.request_id, c) for c in completions)
        return completions

    def submit(self, requests: Sequence[Request]) -> None:
        self.rollout.submit(requests)

    def poll(self, max_steps: int) -> list[Completion]:
        completions = self.rollout.poll(max_steps)
        self.finished.update((c.request_id, c) for c in completions)
        return completions

    def abort(self, request_ids: Sequence[str]) -> list[Completion]:
        partials = self.rollout.abort(request_ids)
        self.aborted.update((c.request_id, c) for c in partials)
        return partials

    def has_unfinished(self) -> bool:
        return self.rollout.has_unfinished()

    def stats(self):
        return self.rollout.stats()

    def round_trace(self, iteration: int, round_kind: str, requests: Sequence[Request], result: RoundResult,
                    max_new_tokens: int, generate_s: float | None = None) -> TraceRound:
        kept = {c.request_id for _, completions in result.completed for c in completions}
        aborted = set(result.aborted_request_ids)
        steps = getattr(self.rollout, "finish_steps", {})
        prompts: dict[str, list[TraceResponse]] = {}
        prompt_tokens: dict[str, int] = {}
        for request in requests:
            rid, problem_id = request.request_id, problem_id_of(request.request_id)
            prompt_tokens[problem_id] = len(request.prompt_token_ids)
            prompts.setdefault(problem_id, []).append(self._response(rid, kept, aborted, steps))
        return TraceRound(iteration, round_kind, max_new_tokens, generate_s,
                          tuple(TracePrompt(p, prompt_tokens[p], tuple(r)) for p, r in prompts.items()))

    def _response(self, rid: str, kept: set[str], aborted: set[str], steps: dict) -> TraceResponse:
        index = int(rid.rpartition("#")[2])
        finished, partial = self.finished.get(rid), self.aborted.get(rid)
        outcome = "aborted" if rid in aborted else "kept" if rid in kept else "finished"
        if finished is None:  # stopped by the rule before it finished (or lost): its length is a lower bound
            return TraceResponse(index, len(partial.token_ids) if partial else 0, "abort", None, None, "aborted")
        # finished: kept, not kept, or finished in the same poll as the abort that discarded it (its length is exact)
        worker, step = steps.get(rid, (None, None))
        return TraceResponse(index, len(finished.token_ids), finished.finish_reason.value, step, worker, outcome)
