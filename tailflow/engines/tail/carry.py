"""Deferred prompts that keep their draws: the long round continues what the short round began.

By default a short round discards every response of a prompt it defers, and
the prompt's long round draws R0 new ones. The round kept the prompts whose
draws happened to finish first, so throwing the others' draws away and drawing
again trains a sample shorter than the policy's (issue 39), and wastes their
tokens. With `tail.continue_deferred` the completion rule hands each deferred
prompt's first R0 responses by launch index on (`RoundResult.carried`):
finished ones whole, the others with the tokens they had. Here they become a
`CarriedGroup` (plain JSON: committed with the run in `PipelineState.carried`
until the long round takes the prompt, then in that round's `SavedRound`), and
the long round's requests continue them: a finished response is shown to the
new round's rule as finished, an unfinished one is resubmitted with its tokens
as a `ResponsePrefix`, exactly as the pipeline resubmits a request across a
weight sync. Every token keeps the behaviour log-prob and weight version that
sampled it, so the off-policy loss corrects the older ones.

Each response keeps its first request's sampling seed: the engine advances the
sampler past the prefix, so a continued response draws what it would have
drawn uninterrupted (under the weights of the moment), and a resumed run
continues it bit for bit.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from tailflow.engines.env.trajectory import TrajectoryOutcome
from tailflow.engines.rollout.protocol import Completion, FinishReason, Request


class TrajectoryParts(BaseModel):
    """What a saved multi-turn trajectory keeps beside its tokens (empty and None for a single-turn response):
    the saved forms of completions (here and `pipeline_state.SavedCompletion`) share it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_token_ids: list[int] = []
    """The task's prompt and the first observation; empty: the request's prompt (every single-turn response)."""
    response_mask: list[bool] = []
    """`Completion.response_mask`."""
    outcome: TrajectoryOutcome | None = None
    """How it ended or, aborted, how to continue it (`Completion.outcome`)."""

    @staticmethod
    def parts_of(completion: Completion) -> dict:
        if completion.outcome is None:
            return {}
        return {"prompt_token_ids": list(completion.prompt_token_ids),
                "response_mask": list(completion.response_mask), "outcome": completion.outcome}

    def restored(self, completion: Completion) -> Completion:
        """`completion` (rebuilt from the tokens and the request) with these parts back."""
        if self.outcome is None:
            return completion
        return replace(completion, prompt_token_ids=tuple(self.prompt_token_ids) or completion.prompt_token_ids,
                       response_mask=tuple(self.response_mask), outcome=self.outcome)


class CarriedResponse(TrajectoryParts):
    """One response of a deferred prompt, as its short round left it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    """Its place in the prompt's group (`Request.index`)."""
    seed: int | None
    """The sampling seed of the request that began it (kept, so the continuation draws what it would have)."""
    token_ids: list[int] = []
    """What it had: every token of a finished response, the tokens so far of an aborted one (maybe none)."""
    logprobs: list[float] = []
    finish_reason: FinishReason = FinishReason.ABORT
    """`abort`: to be continued; anything else: finished, trained as it is."""
    weight_version: int = 0
    token_weight_versions: list[int] = []
    """Per token, when more than one version sampled it (`Completion.token_weight_versions`)."""

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not FinishReason.ABORT

    def completion(self, request: Request) -> Completion:
        """This response under `request` (the continuing round's: its id and prompt)."""
        return self.restored(request.completion(tuple(self.token_ids), tuple(self.logprobs), self.finish_reason,
                                                self.weight_version, tuple(self.token_weight_versions)))

    def request(self, fresh: Request, deferred_iteration: int) -> Request:
        """`fresh` (the continuing round's request for this index) with this response's seed and tokens, under an
        id of its own (`<fresh id>@<deferred iteration>`): the round that deferred it may still be live, its
        scorer still waiting for a response of the fresh id (the reward pool keys outcomes by request id)."""
        params = replace(fresh.params, seed=self.seed)
        prefix = self.completion(fresh).as_prefix() if self.token_ids and not self.is_finished else None
        return replace(fresh, request_id=f"{fresh.request_id}@{deferred_iteration}", params=params, prefix=prefix)


class CarriedGroup(BaseModel):
    """A deferred prompt's first R0 responses, waiting for (or continued by) its long round."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    problem_id: str
    deferred_iteration: int
    """The round that deferred it (the oldest tokens' round)."""
    responses: list[CarriedResponse]
    """By index: 0 .. R0 - 1."""

    def by_index(self) -> dict[int, CarriedResponse]:
        return {response.index: response for response in self.responses}

    def continues(self, request: Request) -> CarriedResponse | None:
        """The carried response `request` continues (a request of the continuing round), if any."""
        if request.problem_id != self.problem_id:
            return None
        return self.by_index().get(request.index)


def carried_groups(carried: Mapping[str, Sequence[Completion]], requests: Iterable[Request], responses_kept: int,
                   iteration: int) -> list[CarriedGroup]:
    """The groups of a round's deferred prompts (`RoundResult.carried`), in its launch order. `requests`: the
    round's, for each response's seed; a response that came back with nothing (a request lost, or aborted
    before an engine took it) is carried empty, to start over with its own seed."""
    groups: dict[str, list[CarriedResponse]] = {}
    for request in requests:
        if request.problem_id not in carried or request.index >= responses_kept:
            continue
        came_back = {c.request_id: c for c in carried[request.problem_id]}.get(request.request_id)
        response = CarriedResponse(index=request.index, seed=request.params.seed)
        if came_back is not None:
            response = CarriedResponse(index=request.index, seed=request.params.seed,
                                       token_ids=list(came_back.token_ids), logprobs=list(came_back.logprobs),
                                       finish_reason=came_back.finish_reason, weight_version=came_back.weight_version,
                                       token_weight_versions=list(came_back.token_weight_versions),
                                       **TrajectoryParts.parts_of(came_back))
        groups.setdefault(request.problem_id, []).append(response)
    return [CarriedGroup(problem_id=problem_id, deferred_iteration=iteration,
                         responses=sorted(responses, key=lambda r: r.index))
            for problem_id, responses in groups.items()]


def continued_requests(requests: Sequence[Request], groups: Sequence[CarriedGroup]) -> list[Request]:
    """A long round's fresh requests, those of a carried prompt replaced by its responses' continuations (same
    index and prompt, an id of their own, the carried seed and tokens). An index the group lacks stays fresh."""
    carried = {group.problem_id: group for group in groups}
    continued = []
    for request in requests:
        group = carried.get(request.problem_id)
        response = group.continues(request) if group is not None else None
        continued.append(response.request(request, group.deferred_iteration) if response is not None else request)
    return continued


def carried_response_of(request: Request, groups: Sequence[CarriedGroup]) -> CarriedResponse | None:
    """What a continuing round's request carries (None: it started in this round)."""
    for group in groups:
        response = group.continues(request)
        if response is not None:
            return response
    return None


def finished_carried(requests: Mapping[str, Request], groups: Sequence[CarriedGroup]) -> list[Completion]:
    """The carried responses that had finished, as completions of the continuing round's requests (launch
    order): its rule is shown them at once, nothing is submitted for them."""
    carried = [(request, carried_response_of(request, groups)) for request in requests.values()]
    return [response.completion(request) for request, response in carried if response and response.is_finished]


def continued_lengths(requests: Mapping[str, Request], groups: Sequence[CarriedGroup]) -> dict[str, int]:
    """Request id -> the tokens it carried from the round that deferred its prompt (those with none left out):
    what `rollout_trace.jsonl` marks as continued."""
    carried = {rid: carried_response_of(request, groups) for rid, request in requests.items()}
    return {rid: len(response.token_ids) for rid, response in carried.items() if response and response.token_ids}
