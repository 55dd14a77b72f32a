"""The completion rule: when a prompt is done, when the round is done, what to abort.

RollPacker's short round (arXiv 2509.21009): a prompt *completes* when R0 of its
responses have finished (EOS, STOP or LENGTH); its other responses are aborted
at once and the first R0 to finish are kept. When P0 prompts have completed,
every other in-flight request is aborted and those prompts are deferred to the
long-prompt queue. Partial responses are discarded (by default; see
`carries_deferred` below).

This is not on-policy sampling. A completed prompt keeps the first R0 of its R
launched responses to finish, i.e. its shortest, and loses its longest R - R0:
the trained sample is shorter than the policy's, and less rewarded where longer
answers are more often right (issue 25 reports a simulation with this rule:
policy mean length 37.8 / reward 0.441, trained 26.1 / 0.361; not re-run
here). It is RollPacker's design (its
Fig. 8 shows accuracy held), not a correction. `RoundResult.unkept_lengths`
lets `engines/track/tail_bias.py` measure it every round
(`tail/kept_length_mean` against `tail/completed_length_mean` and
`tail/launched_length_mean`). With R = R0 (`tail.responses_launched` =
`rollout.n`) a completed prompt keeps every response it launched and only
whole prompts are deferred, but that is still a selection: the round keeps the
prompts whose whole group finished first, i.e. whose draws happened to be
short, and by default a deferred prompt's draws are discarded and its long
round draws again, so the trained sample stays shorter than the policy's
(issue 39: 69.4 tokens against 75.2 in a simulation where every prompt has
the same LogNormal length; tests/test_tail_continue.py: 69.7 against 75.3).
With `carries_deferred` (`tail.continue_deferred`) the rule instead hands
each deferred prompt's first R0 responses by launch index (finished or
partial) to its long round (`RoundResult.carried`, carry.py), which continues
them: every launched prompt then trains its first R0 draws (the same test:
75.3). What remains is the within-prompt selection of R > R0, and when each
prompt trains: a deferred one later, from tokens older weights sampled (the
off-policy loss corrects them per token).

Multi-turn trajectories whose environment failed (`env_error`, `timeout`: trained as dropped) never count as
finished while the prompt can still reach R0 without them: with responses launched beyond R0 (redundant
environment rollout) the first R0 that ended well are kept, and a failed environment costs no wait. Only a
prompt that can no longer reach R0 good ones completes with failed ones filling its R0 (not trained, out of the
group's baseline: `train/samples.py`), as every prompt did with R = R0 before.

Completions are processed strictly in the order given (the engine's finish
order), so the outcome is deterministic even when several prompts complete in
one engine step: the prompt that completes P0-th ends the round, and anything
after it, even in the same batch, counts as aborted. A completion for a request
already aborted (a race with another worker) is ignored and counted as waste,
unless `carries_deferred` carries it on (it finished: its deferred prompt keeps it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from tailflow.engines.data.problem import Problem
from tailflow.engines.env.trajectory import TrainingRule
from tailflow.engines.rollout.protocol import Completion, FinishReason, Request
from tailflow.engines.tail.planner import RoundKind, RoundPlan


@dataclass(frozen=True)
class RoundResult:
    completed: list[tuple[str, tuple[Completion, ...]]]
    """(problem id, its R0 kept completions in finish order), in completion order."""
    deferred_problem_ids: list[str]
    """Launched prompts that did not complete, in launch order: for the long-prompt queue."""
    aborted_request_ids: list[str]
    """Every request the rule ordered aborted, in the order it did."""
    wasted_tokens: int
    """Tokens generated but not trained on: aborted partials, finished-but-not-kept responses."""
    unkept_lengths: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Problem id -> the lengths of its launched responses that were not kept, in launch order: a finished one's
    length, an aborted one's tokens so far (a lower bound of the length it would have reached). Every launched
    prompt is here; a completed one with its R - R0 aborted siblings (none when R = R0)."""
    carried: dict[str, tuple[Completion, ...]] = field(default_factory=dict)
    """Deferred problem id -> its first R0 responses by launch index that have tokens (finished, or the partial
    the abort returned), for its long round to continue (`carries_deferred` only; their tokens are not in
    `wasted_tokens`, but their lengths are in `unkept_lengths`: this round did not train them)."""
    wasted_completed_tokens: int = 0
    """The part of `wasted_tokens` from completed prompts (their responses beyond R0); the rest is deferred
    prompts' (`tail/wasted_tokens_completed` and `tail/wasted_tokens_deferred`)."""

    def trained_in_launch_order(self, launched: Sequence[Problem]) -> tuple[list[Problem], list[Completion]]:
        """The completed problems in launch order and all their kept completions.

        Launch order, not finish order, fixes the order of the training batch, so
        a synchronous round trains exactly as a batch-generate round would.
        """
        kept = dict(self.completed)
        problems = [problem for problem in launched if problem.problem_id in kept]
        return problems, [completion for problem in problems for completion in kept[problem.problem_id]]


class CompletionRule:
    """One round's completion state; `observe` each batch of finished requests, abort what it returns."""

    def __init__(self, requests: Sequence[Request], responses_kept: int, prompts_to_complete: int,
                 carries_deferred: bool = False) -> None:
        if responses_kept < 1 or prompts_to_complete < 1:
            raise ValueError(f"R0={responses_kept} and P0={prompts_to_complete} must both be >= 1")
        request_ids = [r.request_id for r in requests]
        if len(set(request_ids)) != len(request_ids):
            raise ValueError("request ids of one round must be unique")
        self.responses_kept = responses_kept
        self.prompts_to_complete = prompts_to_complete
        self.carries_deferred = carries_deferred
        """Deferred prompts hand their first R0 responses on (`RoundResult.carried`) instead of wasting them."""
        self._requests_of: dict[str, list[str]] = {}
        """problem id -> its request ids; dict order is launch order."""
        for request in requests:
            self._requests_of.setdefault(request.problem_id, []).append(request.request_id)
        short = [p for p, ids in self._requests_of.items() if len(ids) < responses_kept]
        if short:
            raise ValueError(f"prompts {short} have fewer than responses_kept={responses_kept} requests")
        if len(self._requests_of) < prompts_to_complete:
            num_prompts = len(self._requests_of)
            raise ValueError(f"{num_prompts} prompts launched, fewer than prompts_to_complete={prompts_to_complete}")
        self._in_flight: dict[str, None] = dict.fromkeys(request_ids)
        self._finished: dict[str, list[Completion]] = {p: [] for p in self._requests_of}
        """problem id -> its finished completions observed while it could still complete (failed environments'
        trajectories apart: `_failed`)."""
        self._failed: dict[str, list[Completion]] = {p: [] for p in self._requests_of}
        """problem id -> its trajectories whose environment failed, in finish order."""
        self._completed: list[str] = []
        self._aborted: list[str] = []
        self._wasted: dict[str, int] = {}
        """request id -> tokens thrown away (one entry per request, so no double counting)."""
        self._late: dict[str, Completion] = {}
        """request id -> what came back after the rule had aborted it (it finished in the same poll as the abort,
        or raced it on another worker): carried on with `carries_deferred`."""

    @property
    def is_done(self) -> bool:
        """P0 prompts completed, or nothing left in flight (only if requests were lost elsewhere)."""
        return len(self._completed) >= self.prompts_to_complete or not self._in_flight

    @property
    def num_aborted(self) -> int:
        return len(self._aborted)

    def aborted_request_ids(self) -> list[str]:
        """Every request this rule ordered aborted, in the order it did."""
        return list(self._aborted)

    def in_flight_request_ids(self) -> list[str]:
        """Launched, not finished, not aborted: what the engines still owe this round, in launch order."""
        return list(self._in_flight)

    def observe(self, completions: Sequence[Completion]) -> list[str]:
        """Take finished requests in finish order; return the request ids to abort now."""
        to_abort: list[str] = []
        for completion in completions:
            request_id = completion.request_id
            if request_id not in self._in_flight:
                if request_id not in self._wasted:
                    raise KeyError(f"request {request_id!r} is not in flight (never launched here, or finished twice)")
                self._wasted[request_id] = max(self._wasted[request_id], len(completion.token_ids))
                self._late[request_id] = completion
                continue  # aborted earlier: it raced the abort, and is discarded
            del self._in_flight[request_id]
            if completion.finish_reason is FinishReason.ABORT:  # aborted by someone else: lost
                self._wasted[request_id] = len(completion.token_ids)
                continue
            problem_id = completion.problem_id
            failed = completion.outcome is not None and completion.outcome.rule is TrainingRule.DROPPED
            (self._failed if failed else self._finished)[problem_id].append(completion)
            if self._can_complete(problem_id):
                self._completed.append(problem_id)
                to_abort += self._abort([r for r in self._requests_of[problem_id] if r in self._in_flight])
                if len(self._completed) == self.prompts_to_complete:
                    to_abort += self._abort(list(self._in_flight))
        return to_abort

    def _can_complete(self, problem_id: str) -> bool:
        """R0 good ones finished; or R0 ended and no longer R0 good ones to be had (failed ones fill in)."""
        good, failed = len(self._finished[problem_id]), len(self._failed[problem_id])
        if good == self.responses_kept:
            return True
        running = sum(1 for r in self._requests_of[problem_id] if r in self._in_flight)
        return good + running < self.responses_kept <= good + failed

    def _abort(self, request_ids: list[str]) -> list[str]:
        for request_id in request_ids:
            del self._in_flight[request_id]
            self._wasted[request_id] = 0
        self._aborted += request_ids
        return request_ids

    def completed_problem_ids(self) -> list[str]:
        return list(self._completed)

    def kept(self, problem_id: str) -> list[Completion]:
        """The first R0 finished responses of a completed prompt, in finish order (failed environments'
        trajectories after the good ones, only as many as it takes to make R0)."""
        if problem_id not in self._completed:
            raise KeyError(f"prompt {problem_id!r} has not completed")
        return (self._finished[problem_id] + self._failed[problem_id])[: self.responses_kept]

    def unfinished_problem_ids(self) -> list[str]:
        """Launched but not completed, in launch order: these go to the long-prompt queue."""
        return [p for p in self._requests_of if p not in self._completed]

    def result(self, aborted_partials: Sequence[Completion] = ()) -> RoundResult:
        """The round's outcome; `aborted_partials` are what the engine's abort() returned."""
        if not self.is_done:
            raise RuntimeError("the round is still running: observe completions until is_done")
        wasted = dict(self._wasted)
        for partial in aborted_partials:
            wasted[partial.request_id] = max(wasted.get(partial.request_id, 0), len(partial.token_ids))
        for problem_id in self.unfinished_problem_ids():
            wasted.update((c.request_id, len(c.token_ids)) for c in self._finished[problem_id])
            wasted.update((c.request_id, len(c.token_ids)) for c in self._failed[problem_id])
        for problem_id in self._completed:  # failed ones beyond what filled R0
            kept = {c.request_id for c in self.kept(problem_id)}
            wasted.update((c.request_id, len(c.token_ids)) for c in self._failed[problem_id]
                          if c.request_id not in kept)
        completed = [(p, tuple(self.kept(p))) for p in self._completed]
        unkept = {problem_id: tuple(wasted[r] for r in request_ids if r in wasted)
                  for problem_id, request_ids in self._requests_of.items()}
        carried = self._carried(aborted_partials) if self.carries_deferred else {}
        for completions in carried.values():
            for completion in completions:
                wasted.pop(completion.request_id, None)
        of_completed = {r for p in self._completed for r in self._requests_of[p]}
        return RoundResult(completed, self.unfinished_problem_ids(), list(self._aborted), sum(wasted.values()),
                           unkept, carried, sum(n for r, n in wasted.items() if r in of_completed))

    def _carried(self, aborted_partials: Sequence[Completion]) -> dict[str, tuple[Completion, ...]]:
        """Each deferred prompt's first R0 requests in launch order (response index order, `launch.py`) that came
        back: the finished response (one that finished in the same poll as the abort too), else the partial the
        abort returned (maybe empty). By index, never by finish order:
        the finished ones first would be the short ones, the selection this exists to avoid."""
        came_back = {c.request_id: c for c in aborted_partials}
        came_back.update((r, c) for r, c in self._late.items() if c.finish_reason is not FinishReason.ABORT)
        carried = {}
        for problem_id in self.unfinished_problem_ids():
            came_back.update((c.request_id, c) for c in self._finished[problem_id] + self._failed[problem_id])
            first = self._requests_of[problem_id][: self.responses_kept]
            carried[problem_id] = tuple(came_back[r] for r in first if r in came_back)
        return carried


class WaitForAllRule(CompletionRule):
    """Long and synchronous rounds: every launched response is kept, nothing is aborted.

    The same rule with P0 = every prompt and R0 = every response, so the caller
    drives all round kinds alike. A request lost elsewhere (an ABORT completion
    the rule did not order) leaves its prompt unfinished: the caller defers it.
    """

    def __init__(self, requests: Sequence[Request], responses_kept: int, carries_deferred: bool = False) -> None:
        num_prompts = len({r.problem_id for r in requests})
        super().__init__(requests, responses_kept, num_prompts, carries_deferred)
        extra = [p for p, ids in self._requests_of.items() if len(ids) != responses_kept]
        if extra:
            raise ValueError(f"prompts {extra} were not launched with exactly responses_kept={responses_kept} requests")


def rule_for(plan: RoundPlan, requests: Sequence[Request], carries_deferred: bool = False) -> CompletionRule:
    """The rule that drives `plan`'s round: speculative for SHORT, wait-for-all otherwise."""
    if plan.kind is RoundKind.SHORT:
        return CompletionRule(requests, plan.responses_kept, plan.prompts_to_complete, carries_deferred)
    return WaitForAllRule(requests, plan.responses_kept, carries_deferred)
