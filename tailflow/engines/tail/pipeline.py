"""Asynchronous rollout with bounded staleness: rounds that run ahead of training (ROLL-Flash, composed with
tail batching).

Round j is the batch iteration j trains. With `rollout.async_ratio` alpha >= 1
the rollout workers do not wait for the trainer: round j is launched as soon as

- j <= w + floor(alpha), where w is the round the engines' weights will
  train (the trainer's current step): round j's first tokens are sampled by
  those weights or later ones and trained at iteration j, so no trained token
  is more than floor(alpha) versions stale (the bound holds by construction:
  no group ever has to be aborted for it);
- and the prompts in flight (launched, not yet completed) stay within
  ceil(alpha * P0) + P0. The round the trainer needs next is always launched.

Each round keeps its own completion rule (a short round aborts its stragglers
and queues their prompts, a long round waits for all: `completion.py`), so
tail batching works inside every round unchanged; a finished request goes to
the rule of the round that launched it. A round that completes settles at once
(its deferred prompts join the long-prompt queue, where the next round planned
sees them) and waits, finished, for its iteration.

Weight sync: `pause` stops every request in flight and keeps what it has;
after the engines load the new weights, `resume` resubmits them, continuing
from their tokens (`partial`: each token keeps the version and log-prob that
sampled it, the prefix is re-prefilled with the new weights) or from scratch.
Always stopping and resubmitting, even where an engine could continue in
place, is what makes a resumed run equal to an uninterrupted one: a commit is
taken right after `resume`, and a resumed run resubmits the same requests with
the same tokens in the same order (`snapshot` / `restore`).

Nothing here reads the clock to decide anything: what runs is decided by the
order of engine steps, so a run on one rollout worker that advances a fixed
number of engine steps per train step (`rollout.async_steps_per_train`) is
reproducible bit for bit.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout.protocol import Completion, EngineStats, Request
from tailflow.engines.rollout.rollout_stats import RolloutStats, summarize_rollout
from tailflow.engines.tail.completion import CompletionRule, RoundResult, rule_for
from tailflow.engines.tail.driver import StreamingRollout, stalled_error
from tailflow.engines.tail.pipeline_state import PipelineState, SavedCompletion, SavedRound
from tailflow.engines.tail.roll_out import RoundRollout
from tailflow.engines.tail.round import PlannedRound, begin_round, settle_round
from tailflow.engines.tail.state import TailSettings, TailState


@dataclass
class LiveRound:
    planned: PlannedRound
    requests: dict[str, Request]
    """By request id, in launch order."""
    rule: CompletionRule
    launched_version: int
    observed: list[Completion] = field(default_factory=list)
    """Every completion shown to the rule, in order."""
    aborted: list[Completion] = field(default_factory=list)
    """Partials of the requests the rule aborted."""
    settled: bool = False


@dataclass(frozen=True)
class TakenRound:
    """Round i as the trainer takes it, with how stale its responses are."""

    planned: PlannedRound
    rollout: RoundRollout
    staleness: dict[int, int]
    """Versions between the trained weights and a response's oldest token -> number of responses."""
    mixed_version_responses: int
    """Kept responses whose tokens come from more than one weight version (continued across a sync)."""
    rounds_ahead: int
    """Rounds launched beyond this one when it was taken."""
    prompts_in_flight: int


@dataclass(frozen=True)
class OverlapStats:
    """What the rollout did while the trainer ran a step."""

    seconds: float
    """Wall time the driver spent driving the rollout while the train step ran."""
    engine_steps: int
    """Engine steps asked for (per worker) meanwhile."""
    finished: int
    """Responses finished meanwhile."""
    tokens: int
    """Tokens generated meanwhile (not in the next round's `rollout/tokens`, which counts from the sync)."""


class RolloutPipeline:
    """The live rounds of an asynchronous run, over the run's rollout workers.

    `make_requests` turns a planned round into its seeded requests (the same ones a synchronous round would
    launch). `position` is the round the trainer takes next; None until `restore` has set it up from a commit.
    """

    def __init__(self, rollout: StreamingRollout, settings: TailSettings, alpha: float, partial: bool,
                 problems: Sequence[Problem], problems_by_id: Mapping[str, Problem],
                 make_requests: Callable[[PlannedRound], list[Request]]) -> None:
        if alpha < 1:
            raise ValueError(f"an asynchronous pipeline needs async_ratio >= 1, got {alpha}")
        self.rollout = rollout
        self.settings = settings
        self.alpha = alpha
        self.partial = partial
        self.problems = problems
        self.problems_by_id = problems_by_id
        self.make_requests = make_requests
        self.position: int | None = None
        self.weights_round = 0
        """The round the engines' current weights train (the staleness bound counts from it)."""
        self.version = 0
        self.tail = TailState()
        self.rounds: dict[int, LiveRound] = {}
        self.round_of: dict[str, int] = {}
        """In-flight request id -> the round that launched it."""
        self.resubmitted: list[Completion] | None = []
        """What the last `resume` resubmitted (the commit's `in_flight`); None once the engines stepped again."""
        self.paused: list[Completion] | None = None
        self.stats_mark: list[EngineStats] | None = None

    @property
    def max_staleness(self) -> int:
        """floor(alpha): the most versions a trained token can lag the weights that train it."""
        return math.floor(self.alpha)

    @property
    def max_prompts_in_flight(self) -> int:
        p0 = self.settings.prompts_per_step
        return math.ceil(round(self.alpha * p0, 9)) + p0

    def rebound(self, rollout: StreamingRollout) -> "RolloutPipeline":
        """A pipeline with these settings over new rollout workers (after an actor died), to be restored."""
        return RolloutPipeline(rollout, self.settings, self.alpha, self.partial, self.problems, self.problems_by_id,
                               self.make_requests)

    # ---- from and to a commit ------------------------------------------------------------------

    def is_at(self, iteration: int) -> bool:
        return self.position == iteration and self.paused is None

    def restore(self, saved: PipelineState, tail: TailState, iteration: int, version: int) -> None:
        """Set up the live rounds of the commit before `iteration` and resubmit its requests in flight.

        Anything this pipeline still had in the engines (an iteration that failed after the commit) is
        aborted first."""
        if self.round_of:
            self.rollout.abort(list(self.round_of))
        self.rounds, self.round_of, self.tail = {}, {}, tail
        self.position, self.version, self.paused = iteration, version, None
        for saved_round in saved.rounds:
            self._replay(saved_round)
        in_flight = {rid for live in self.rounds.values() for rid in live.rule.in_flight_request_ids()}
        saved_ids = [c.request_id for c in saved.in_flight]
        if set(saved_ids) != in_flight or len(saved_ids) != len(in_flight):
            raise ValueError(f"the committed pipeline is inconsistent: its rules wait for {sorted(in_flight)} but "
                             f"its requests in flight are {saved_ids}")
        partials = [c.completion(self._request(c.request_id).prompt_token_ids) for c in saved.in_flight]
        self.paused = partials
        self.resume(version)

    def _replay(self, saved: SavedRound) -> None:
        plan = saved.plan()
        problems = [self.problems_by_id[pid] for pid in saved.problem_ids]
        planned = PlannedRound(plan, problems, self.tail)
        requests = self.make_requests(planned)
        prompt_of = {r.request_id: r.prompt_token_ids for r in requests}
        live = LiveRound(planned, {r.request_id: r for r in requests}, rule_for(plan, requests), saved.launched_version)
        for completion in saved.observed:
            live.rule.observe([completion.completion(prompt_of[completion.request_id])])
            live.observed.append(completion.completion(prompt_of[completion.request_id]))
        live.aborted = [c.completion(prompt_of[c.request_id]) for c in saved.aborted]
        live.settled = live.rule.is_done
        self.rounds[plan.iteration] = live
        self.round_of.update((rid, plan.iteration) for rid in live.rule.in_flight_request_ids())

    def snapshot(self) -> PipelineState:
        """The committed form; only right after `resume` (the engines have not stepped since)."""
        if self.resubmitted is None or self.paused is not None:
            raise RuntimeError("snapshot() is only valid right after resume(): the engines have stepped since")
        rounds = [SavedRound(kind=live.planned.plan.kind, iteration=j, fresh_prompts=live.planned.plan.fresh_prompts,
                             queued=list(live.planned.plan.queued),
                             responses_per_prompt=live.planned.plan.responses_per_prompt,
                             responses_kept=live.planned.plan.responses_kept,
                             prompts_to_complete=live.planned.plan.prompts_to_complete,
                             problem_ids=[p.problem_id for p in live.planned.problems],
                             launched_version=live.launched_version,
                             observed=[SavedCompletion.of(c) for c in live.observed],
                             aborted=[SavedCompletion.of(c) for c in live.aborted])
                  for j, live in sorted(self.rounds.items())]
        return PipelineState(rounds=rounds, in_flight=[SavedCompletion.of(c) for c in self.resubmitted])

    # ---- driving -------------------------------------------------------------------------------

    def take(self, iteration: int) -> TakenRound:
        """Launch what the bounds allow and drive the engines until round `iteration` is done; hand it over."""
        if not self.is_at(iteration):
            raise RuntimeError(f"the pipeline is at round {self.position} (paused: {self.paused is not None}), "
                               f"not {iteration}: restore it from the last commit first")
        started = time.perf_counter()
        before = self.stats_mark
        self._launch()
        live = self.rounds[iteration]
        while not live.rule.is_done:
            self.poll(self.settings.steps_per_poll)
        del self.rounds[iteration]
        self.position = iteration + 1
        result = live.rule.result(live.aborted)
        problems, completions = result.trained_in_launch_order(live.planned.problems)
        stats = summarize_rollout(completions, before, self.rollout.stats(), time.perf_counter() - started)
        rollout = RoundRollout(iteration, list(live.requests.values()), result, stats, problems, completions)
        staleness: dict[int, int] = {}
        for completion in completions:
            lag = self.version - completion.oldest_weight_version
            staleness[lag] = staleness.get(lag, 0) + 1
        self._launch()  # the next round starts while this one is scored and trained
        return TakenRound(live.planned, rollout, dict(sorted(staleness.items())),
                          sum(1 for c in completions if c.token_weight_versions), len(self.rounds),
                          self.prompts_in_flight())

    def roll_while(self, busy: Callable[[], bool], fixed_steps: int = 0) -> OverlapStats:
        """Drive the rollout while the trainer works: until `busy()` is false, or exactly `fixed_steps` engine
        steps (the deterministic mode; `busy` is then not asked). Stops early only if nothing is left to run."""
        started, steps, finished, before = time.perf_counter(), 0, 0, self.rollout.stats()
        per_poll = self.settings.steps_per_poll
        while (steps < fixed_steps) if fixed_steps else busy():
            if not self.round_of:
                break
            n = min(per_poll, fixed_steps - steps) if fixed_steps else per_poll
            finished += self.poll(n)
            steps += n
        tokens = sum(a.tokens_generated - b.tokens_generated for a, b in zip(self.rollout.stats(), before))
        return OverlapStats(time.perf_counter() - started, steps, finished, tokens)

    def poll(self, max_steps: int) -> int:
        """Step the engines, give each finished request to its round's rule, abort what the rules say; settle
        rounds that completed and launch what that allows. Returns how many requests finished."""
        self.resubmitted = None
        finished = self.rollout.poll(max_steps)
        if not finished and not self.rollout.has_unfinished():
            waiting = [live.rule for live in self.rounds.values() if not live.rule.is_done]
            if waiting:
                raise stalled_error(waiting[0])
        to_abort: list[str] = []
        for completion in finished:
            j = self.round_of.pop(completion.request_id, None)
            if j is None:
                continue  # not in flight for any round (a late completion of an aborted request): discarded
            live = self.rounds[j]
            live.observed.append(completion)
            aborted = live.rule.observe([completion])
            for request_id in aborted:
                self.round_of.pop(request_id, None)
            to_abort += [(j, request_id) for request_id in aborted]
        if to_abort:
            owner = dict((rid, j) for j, rid in to_abort)
            for partial in self.rollout.abort([rid for _, rid in to_abort]):
                self.rounds[owner[partial.request_id]].aborted.append(partial)
        self._settle()
        self._launch()
        return len(finished)

    def _settle(self) -> None:
        for live in self.rounds.values():
            if live.rule.is_done and not live.settled:
                self.tail = settle_round(live.planned, live.rule.result(live.aborted), self.tail)
                live.settled = True

    def _launch(self) -> None:
        while True:
            j = max(self.rounds, default=self.position - 1) + 1
            ahead = j != self.position
            if ahead and j > self.weights_round + self.max_staleness:
                return
            live_problems = {p.problem_id for live in self.rounds.values() for p in live.planned.problems}
            planned = begin_round(self.tail, j, self.settings, self.problems, self.problems_by_id, live_problems)
            if ahead and self.prompts_in_flight() + planned.plan.num_prompts > self.max_prompts_in_flight:
                return
            requests = self.make_requests(planned)
            self.rollout.submit(requests)
            self.tail = planned.tail
            self.rounds[j] = LiveRound(planned, {r.request_id: r for r in requests}, rule_for(planned.plan, requests),
                                       self.version)
            self.round_of.update((r.request_id, j) for r in requests)

    def prompts_in_flight(self) -> int:
        """Prompts launched and not completed (a completed prompt waits for training, it is not in flight)."""
        return sum(len(live.rule.unfinished_problem_ids()) for live in self.rounds.values() if not live.rule.is_done)

    # ---- weight sync -----------------------------------------------------------------------------

    def pause(self) -> int:
        """Stop every request in flight (the engines are then idle and may load weights); returns how many."""
        ids = [rid for _, live in sorted(self.rounds.items()) for rid in live.rule.in_flight_request_ids()]
        partials = {c.request_id: c for c in self.rollout.abort(ids)}
        lost = [rid for rid in ids if rid not in partials]
        if lost:
            raise RuntimeError(f"pausing the rollout: {len(lost)} requests in flight are held by no engine "
                               f"(lost?): {', '.join(lost)}")
        self.paused = [partials[rid] for rid in ids]
        return len(ids)

    def resume(self, version: int) -> None:
        """Resubmit what `pause` stopped, now under weights `version`: from its tokens (partial) or anew."""
        if self.paused is None:
            raise RuntimeError("resume() without pause()")
        self.version, self.weights_round = version, self.position
        requests = [self._continued(partial) for partial in self.paused]
        if requests:
            self.rollout.submit(requests)
        self.resubmitted, self.paused = self.paused, None
        self.stats_mark = self.rollout.stats()  # the next take counts the engines' work from here

    def _continued(self, partial: Completion) -> Request:
        request = self._request(partial.request_id)
        if self.partial and partial.token_ids:
            return replace(request, prefix=partial.as_prefix())
        return request

    def _request(self, request_id: str) -> Request:
        return self.rounds[self.round_of[request_id]].requests[request_id]
