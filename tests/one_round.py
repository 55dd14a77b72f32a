"""One round through the rollout pipeline with given requests and plan (tests that drive a single round)."""
from __future__ import annotations

from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout.protocol import Request
from tailflow.engines.tail.pipeline import RolloutPipeline, Unobserved
from tailflow.engines.tail.planner import RoundKind, RoundPlan
from tailflow.engines.tail.round import PlannedRound
from tailflow.engines.tail.state import TailSettings, TailState
from tailflow.engines.tail.taken import TakenRound


class Watching(Unobserved):
    """An observer that wants each response as it finishes and calls `on_finished` with it."""

    watches_each_response = True

    def __init__(self, on_finished=None) -> None:
        self.seen: list[str] = []
        self.callback = on_finished

    def on_finished(self, completions):
        self.seen += [c.request_id for c in completions]
        if self.callback is not None:
            self.callback(completions)


def take_one_round(rollout, requests: list[Request], kind: RoundKind, responses_kept: int, prompts_to_complete: int,
                   observer=None, steps_per_poll: int = 1, iteration: int = 0) -> TakenRound:
    """Round `iteration` of `kind` over `requests` (their problems in launch order), driven by the product's
    pipeline."""
    problems = [Problem(pid, "", "") for pid in dict.fromkeys(r.problem_id for r in requests)]
    per_prompt = len(requests) // len(problems)
    plan = RoundPlan(kind, iteration, len(problems), (), per_prompt, responses_kept, prompts_to_complete)
    planned = PlannedRound(plan, problems, TailState())
    settings = TailSettings(prompts_to_complete, responses_kept, steps_per_poll=steps_per_poll)
    pipeline = RolloutPipeline(rollout, settings, 0.0, False, problems, lambda _: requests,
                               lambda _planned, _version: observer or Unobserved(),
                               plan=lambda tail, j, live: planned)
    pipeline.start(TailState(), iteration)
    return pipeline.take(iteration)
