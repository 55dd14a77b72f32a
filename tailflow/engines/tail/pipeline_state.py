"""The asynchronous rollout's durable part: rounds running ahead of training, and the requests in flight.

Committed in `RunState.pipeline` with every iteration of an asynchronous run
(`rollout.async_ratio` > 0), right after the weight sync has stopped and
resubmitted the requests in flight. A resumed run rebuilds each round's
completion rule by showing it again every completion it had seen, in the
order it saw them, and resubmits the requests in flight with the tokens they
had (`in_flight`), in the same order: the same engine state as the run that
was not interrupted, so the rest of the run is the same too. Nothing that was
generated is lost: finished responses of rounds not yet trained are here, and
so are the partial ones (tokens, log-probs, weight versions).

With `tail.continue_deferred` it also holds the deferred prompts' responses
that their long round will continue (`carried`), in synchronous runs too.

Plain JSON (no pickle): states are read back from a shared store. Size: every
token of every response of the live rounds (two or three rounds at most), and
of the carried groups (fewer than P0 prompts x R0), about 30 bytes per token.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator

from tailflow.engines.rollout.protocol import Completion, FinishReason, Request
from tailflow.engines.tail.carry import CarriedGroup, TrajectoryParts
from tailflow.engines.tail.planner import RoundPlan


class SavedCompletion(TrajectoryParts):

    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    weight_version: int
    token_weight_versions: list[int] = []

    @classmethod
    def of(cls, completion: Completion) -> "SavedCompletion":
        return cls(request_id=completion.request_id, token_ids=list(completion.token_ids),
                   logprobs=list(completion.logprobs), finish_reason=completion.finish_reason,
                   weight_version=completion.weight_version,
                   token_weight_versions=list(completion.token_weight_versions), **cls.parts_of(completion))

    def completion(self, request: Request) -> Completion:
        """This completion again, with the identity and prompt of `request` (rebuilt from the round's plan), and
        a trajectory's own prompt, mask and outcome."""
        return self.restored(request.completion(tuple(self.token_ids), tuple(self.logprobs), self.finish_reason,
                                                self.weight_version, tuple(self.token_weight_versions)))


class SavedRound(BaseModel):
    """One live round: its plan, its prompts, and what its completion rule has seen so far."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    plan: RoundPlan
    problem_ids: list[str]
    """The round's prompts in launch order."""
    launched_version: int
    """The weight version the engines held when the round was launched."""
    observed: list[SavedCompletion]
    """Every finished response the rule was shown, in that order (replaying them rebuilds the rule)."""
    aborted: list[SavedCompletion]
    """Partial responses the rule had aborted (what they wasted counts in `tail/wasted_tokens`)."""
    carried: list[CarriedGroup] = []
    """The deferred prompts' responses this round continues (tail.continue_deferred): replaying it rebuilds the
    same continued requests."""

    @model_validator(mode="before")
    @classmethod
    def _read_flat_plans(cls, data):
        """Commits written before the plan was one field kept its fields at the top level."""
        plan_fields = ("kind", "iteration", "fresh_prompts", "queued", "responses_per_prompt", "responses_kept",
                       "prompts_to_complete")
        if isinstance(data, dict) and "plan" not in data and "kind" in data:
            data = dict(data)
            data["plan"] = {name: data.pop(name) for name in plan_fields}
        return data


class PipelineState(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: list[SavedRound] = []
    """Rounds launched and not yet trained, oldest first (finished ones wait here for their iteration)."""
    in_flight: list[SavedCompletion] = []
    """The requests in flight at the commit, with the tokens they had (finish reason `abort`), in the order they
    were resubmitted."""
    carried: list[CarriedGroup] = []
    """Deferred prompts' first R0 responses waiting in the long-prompt queue for the long round that continues
    them (tail.continue_deferred, engines/tail/carry.py), in the order they were deferred."""

    @property
    def is_empty(self) -> bool:
        """Nothing running ahead, nothing in flight and nothing carried (always so in a synchronous run without
        tail.continue_deferred)."""
        return not self.rounds and not self.in_flight and not self.carried
