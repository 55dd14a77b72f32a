"""The one rollout driver: rounds under their completion rules, synchronous or running ahead of training.

Round j is the batch iteration j trains. Every run, whatever its mode, goes
through this class; `rollout.async_ratio` alpha is a parameter of it:

- alpha 0 (synchronous): round j is launched once the engines hold the
  weights iteration j trains, and nothing else is in flight: roll out, then
  train, with or without tail batching.
- alpha >= 1 (ROLL-Flash's bounded staleness): round j is launched as soon as
  j <= w + floor(alpha), w the round the engines' weights will train, and the
  prompts in flight (launched, not yet completed) stay within
  ceil(alpha * P0) + P0; the round the trainer needs next is always launched.
  No trained token is then more than floor(alpha) versions stale, by
  construction: no group ever has to be aborted for it.

Both are one rule: launch j while j <= w + floor(alpha) (and, ahead of the trainer, within the in-flight cap).
How each round keeps its own completion rule, settles and is observed: docs/architecture.md, "The one rollout
driver".

Weight sync: `pause` stops every request in flight and keeps what it has;
after the engines load the new weights, `resume` resubmits them, continuing
from their tokens (`partial`: each token keeps the version and log-prob that
sampled it) or from scratch. Always stopping and resubmitting is what makes a
resumed run equal to an uninterrupted one: a commit is taken right after
`resume` (`snapshot` / `restore`). Synchronous runs have nothing in flight
there.

Nothing here reads the clock to decide anything: what runs is decided by the
order of engine steps, so a run on one rollout worker that advances a fixed
number of engine steps per train step (`rollout.async_steps_per_train`) is
reproducible bit for bit.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import AbstractSet, Callable, Protocol, Sequence

from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout.protocol import Completion, EngineStats, Request
from tailflow.engines.rollout.rollout_stats import summarize_rollout
from tailflow.engines.tail.carry import CarriedGroup, carried_groups, continued_lengths, continued_requests, \
    finished_carried
from tailflow.engines.tail.completion import CompletionRule, WaitForAllRule, rule_for
from tailflow.engines.tail.observer import RoundObserver, Unobserved
from tailflow.engines.tail.pipeline_state import PipelineState, SavedCompletion, SavedRound
from tailflow.engines.tail.round import PlannedRound, begin_round, settle_round
from tailflow.engines.tail.state import TailSettings, TailState, in_flight_cap
from tailflow.engines.tail.taken import OverlapStats, TakenRound, staleness_of


class StreamingRollout(Protocol):
    """What the pipeline drives: a `RolloutGroup`, or the simulator's `SimGroup`."""

    def generate(self, requests: Sequence[Request]) -> list[Completion]: ...
    def submit(self, requests: Sequence[Request]) -> None: ...
    def poll(self, max_steps: int) -> list[Completion]: ...
    def abort(self, request_ids: Sequence[str]) -> list[Completion]: ...
    def has_unfinished(self) -> bool:
        """Any engine still holds a request (running or waiting)."""
    def stats(self) -> list[EngineStats]: ...


class RolloutStalled(RuntimeError):
    """Requests are in flight for a round but no engine is working on them (lost by an engine)."""


@dataclass
class LiveRound:
    planned: PlannedRound
    requests: dict[str, Request]
    """By request id, in launch order."""
    rule: CompletionRule
    launched_version: int
    observer: RoundObserver
    is_batch: bool = False
    """Run as one `generate` call when taken (synchronous, wait-for-all, unwatched): on one worker the engine runs
    the same steps either way."""
    observed: list[Completion] = field(default_factory=list)
    """Every completion shown to the rule, in order."""
    aborted: list[Completion] = field(default_factory=list)
    """Partials of the requests the rule aborted."""
    finish_steps: dict[str, tuple[int, int]] = field(default_factory=dict)
    num_completed_shown: int = 0
    """Completed prompts already handed to the observer's `on_completed`."""
    settled: bool = False
    carried: list[CarriedGroup] = field(default_factory=list)
    """The deferred prompts' responses this round continues (tail.continue_deferred; long rounds only)."""

    def pending(self) -> list[Request]:
        """The requests an engine must run: all but the carried responses that had finished already."""
        done = {c.request_id for c in finished_carried(self.requests, self.carried)} if self.carried else set()
        return [request for rid, request in self.requests.items() if rid not in done]

    def show(self, completions: Sequence[Completion]) -> None:
        """The observer sees what finished (less what the rule aborted) and the prompts that completed."""
        aborted = set(self.rule.aborted_request_ids())
        self.observer.on_finished([c for c in completions if c.request_id not in aborted])
        completed = self.rule.completed_problem_ids()[self.num_completed_shown:]
        self.num_completed_shown += len(completed)
        self.observer.on_completed([(pid, tuple(self.rule.kept(pid))) for pid in completed])


class RolloutPipeline:
    """The live rounds of a run over its rollout workers.

    `make_requests` turns a planned round into its seeded requests; `observe(planned, launched_version)` builds
    a round's observer when it is launched; `plan(tail, j, live_problem_ids)` plans round j (default: tail
    batching's `begin_round` over `problems`; a replay of a traced run plans the rounds it had). `position` is
    the round the trainer takes next; None until `restore` has set it up from a commit.
    """

    def __init__(self, rollout: StreamingRollout, settings: TailSettings, alpha: float, partial: bool,
                 problems: Sequence[Problem], make_requests: Callable[[PlannedRound], list[Request]],
                 observe: Callable[[PlannedRound, int], RoundObserver] | None = None,
                 plan: Callable[[TailState, int, AbstractSet[str]], PlannedRound] | None = None) -> None:
        if 0 < alpha < 1:
            raise ValueError(f"async_ratio must be 0 (synchronous) or >= 1, got {alpha}")
        self.rollout, self.settings, self.alpha, self.partial = rollout, settings, alpha, partial
        self.problems, self.problems_by_id = problems, {problem.problem_id: problem for problem in problems}
        self.make_requests = make_requests
        self.observe = observe or (lambda planned, version: Unobserved())
        self.plan = plan or self._plan_from_data
        self.position: int | None = None
        self.weights_round = 0
        """The round the engines' current weights train (the staleness bound counts from it)."""
        self.version = 0
        self.tail = TailState()
        self.rounds: dict[int, LiveRound] = {}
        self.round_of: dict[str, int] = {}
        """Request id -> the round that launched it, for every request of a round not yet taken (a request the
        rule aborted too: one that finished in the same poll still goes to its rule, which counts the waste)."""
        self.resubmitted: list[Completion] | None = []
        """What the last `resume` resubmitted (the commit's `in_flight`); None once the engines stepped again."""
        self.paused: list[Completion] | None = None
        self.stats_mark: list[EngineStats] | None = None
        self.carried: dict[str, CarriedGroup] = {}
        """Deferred prompts' first R0 responses, waiting for the long round that continues them, by problem id
        (`settings.continue_deferred`: carry.py); committed in `PipelineState.carried`."""

    def observe_with(self, observe: Callable[[PlannedRound, int], RoundObserver]) -> None:
        """Rounds launched or replayed from now on get their observer from `observe` (a run hands over the hook
        of the last commit's settings before it takes each round: tasks/rollout.py)."""
        self.observe = observe

    @property
    def is_async(self) -> bool:
        return self.alpha > 0

    @property
    def max_staleness(self) -> int:
        """floor(alpha): the most versions a trained token can lag the weights that train it."""
        return math.floor(self.alpha)

    @property
    def max_prompts_in_flight(self) -> int:
        """ceil(alpha * P0) + P0 (`state.in_flight_cap`)."""
        return in_flight_cap(self.alpha, self.settings.prompts_per_step)

    # ---- from and to a commit ------------------------------------------------------------------

    def start(self, tail: TailState, iteration: int = 0, version: int = 0) -> None:
        """Nothing running yet, round `iteration` next (benches and the simulator; a run restores a commit)."""
        self.restore(PipelineState(), tail, iteration, version)

    def is_at(self, iteration: int) -> bool:
        return self.position == iteration and self.paused is None

    def restore(self, saved: PipelineState, tail: TailState, iteration: int, version: int) -> None:
        """Set up the live rounds of the commit before `iteration` and resubmit its requests in flight. Anything
        this pipeline still had in the engines (an iteration that failed after the commit) is aborted first. The
        commit's carried groups are kept only with `continue_deferred` (a run resumed with it off draws their
        queued prompts again, as it would have; a live round's own carried groups are always rebuilt)."""
        in_flight_before = self._in_flight_ids()
        if in_flight_before:
            self.rollout.abort(in_flight_before)
        self.rounds, self.round_of, self.tail = {}, {}, tail
        self.position, self.version, self.paused = iteration, version, None
        self.carried = {g.problem_id: g for g in saved.carried} if self.settings.continue_deferred else {}
        for saved_round in saved.rounds:
            self._replay(saved_round)
        in_flight = self._in_flight_ids()
        saved_ids = [c.request_id for c in saved.in_flight]
        if set(saved_ids) != set(in_flight) or len(saved_ids) != len(in_flight):
            raise ValueError(f"the committed pipeline is inconsistent: its rules wait for {sorted(in_flight)} but "
                             f"its requests in flight are {saved_ids}")
        self.paused = [c.completion(self._request(c.request_id)) for c in saved.in_flight]
        self.resume(version)

    def _replay(self, saved: SavedRound) -> None:
        """Rebuild a live round by showing its rule (and its observer) what it had seen, in that order."""
        planned = PlannedRound(saved.plan, [self.problems_by_id[pid] for pid in saved.problem_ids], self.tail)
        live = self._add_round(planned, saved.launched_version, saved.carried)
        live.observed = [c.completion(live.requests[c.request_id]) for c in saved.observed]
        live.rule.observe(live.observed)
        live.aborted = [c.completion(live.requests[c.request_id]) for c in saved.aborted]
        live.show(live.observed)  # scored again: nothing a commit held is lost
        live.settled = live.rule.is_done

    def snapshot(self) -> PipelineState:
        """The committed form; only right after `resume` (the engines have not stepped since)."""
        if self.resubmitted is None or self.paused is not None:
            raise RuntimeError("snapshot() is only valid right after resume(): the engines have stepped since")
        rounds = [SavedRound(plan=live.planned.plan, problem_ids=[p.problem_id for p in live.planned.problems],
                             launched_version=live.launched_version,
                             observed=[SavedCompletion.of(c) for c in live.observed],
                             aborted=[SavedCompletion.of(c) for c in live.aborted], carried=live.carried)
                  for _, live in sorted(self.rounds.items())]
        return PipelineState(rounds=rounds, in_flight=[SavedCompletion.of(c) for c in self.resubmitted],
                             carried=list(self.carried.values()))

    # ---- driving -------------------------------------------------------------------------------

    def take(self, iteration: int) -> TakenRound:
        """Launch what the bounds allow and drive the engines until round `iteration` is done; hand it over."""
        if not self.is_at(iteration):
            raise RuntimeError(f"the pipeline is at round {self.position} (paused: {self.paused is not None}), "
                               f"not {iteration}: restore it from the last commit first")
        started, before = time.perf_counter(), self.stats_mark
        self._launch()
        live = self.rounds[iteration]
        if live.is_batch:
            self._generate(live)
        while not live.rule.is_done:
            self.poll(self.settings.steps_per_poll)
        del self.rounds[iteration]
        self.round_of = {rid: j for rid, j in self.round_of.items() if j != iteration}
        self.position = iteration + 1
        taken = self._taken(live, before, time.perf_counter() - started)
        self._launch()  # asynchronous: the next round starts while this one is scored and trained
        return taken

    def _taken(self, live: LiveRound, before: list[EngineStats] | None, seconds: float) -> TakenRound:
        result = live.rule.result(live.aborted)
        problems, completions = result.trained_in_launch_order(live.planned.problems)
        return TakenRound(
            live.planned, list(live.requests.values()), result,
            summarize_rollout(completions, before, self.rollout.stats(), seconds), problems, completions,
            list(live.observed), list(live.aborted), dict(live.finish_steps), live.observer,
            staleness_of(completions, self.version), sum(1 for c in completions if c.token_weight_versions),
            len(self.rounds), self.prompts_in_flight(), continued_lengths(live.requests, live.carried))

    def _generate(self, live: LiveRound) -> None:
        """A batch round: every request to completion in one call, shown to the rule in request order (a
        wait-for-all rule aborts nothing)."""
        self._observe(live.planned.plan.iteration, self.rollout.generate(live.pending()))
        self._settle()

    def roll_while(self, busy: Callable[[], bool], fixed_steps: int = 0) -> OverlapStats:
        """Drive the rollout while the trainer works: until `busy()` is false, or exactly `fixed_steps` engine
        steps (the deterministic mode; `busy` is then not asked). Stops early only if nothing is left to run."""
        if not self._in_flight_ids():
            return OverlapStats()
        started, steps, finished, before = time.perf_counter(), 0, 0, self.rollout.stats()
        per_poll = self.settings.steps_per_poll
        while (steps < fixed_steps) if fixed_steps else busy():
            if not self._in_flight_ids():
                break
            n = min(per_poll, fixed_steps - steps) if fixed_steps else per_poll
            finished += self.poll(n)
            steps += n
        tokens = sum(a.tokens_generated - b.tokens_generated for a, b in zip(self.rollout.stats(), before))
        return OverlapStats(time.perf_counter() - started, steps, finished, tokens)

    def poll(self, max_steps: int) -> int:
        """Step the engines, show each finished request to its round's rule, abort what the rules say, show the
        observers; settle rounds that completed and launch what that allows. Returns how many finished."""
        self.resubmitted = None
        finished = self.rollout.poll(max_steps)
        if not finished and not self.rollout.has_unfinished():
            waiting = [live.rule for live in self.rounds.values() if not live.rule.is_done]
            if waiting:
                in_flight = waiting[0].in_flight_request_ids()
                raise RolloutStalled(f"rollout stalled: {len(in_flight)} requests in flight but no engine has "
                                     f"unfinished work (lost by an engine?): {', '.join(in_flight)}")
        by_round: dict[int, list[Completion]] = {}
        for completion in finished:  # owners first: a request its rule aborts in this batch still goes to it
            j = self.round_of.get(completion.request_id)
            if j is not None:
                by_round.setdefault(j, []).append(completion)
        to_abort = {rid: j for j, completions in by_round.items() for rid in self._observe(j, completions)}
        for partial in self.rollout.abort(list(to_abort)) if to_abort else ():
            self.rounds[to_abort[partial.request_id]].aborted.append(partial)
        for j, completions in by_round.items():
            self.rounds[j].show(completions)
        self._settle()
        self._launch()
        return len(finished)

    def _observe(self, j: int, completions: list[Completion]) -> list[str]:
        """Show round j's rule its finished requests in order; the request ids it aborts."""
        live, to_abort = self.rounds[j], []
        steps = getattr(self.rollout, "finish_steps", {})
        for completion in completions:
            live.observed.append(completion)
            if completion.request_id in steps:
                live.finish_steps[completion.request_id] = steps[completion.request_id]
            to_abort += live.rule.observe([completion])
        return to_abort

    def _settle(self) -> None:
        """Queue the deferred prompts of every round whose rule is done (and keep their responses, carry.py)."""
        for live in self.rounds.values():
            if live.rule.is_done and not live.settled:
                result = live.rule.result(live.aborted)
                self.tail = settle_round(live.planned, result, self.tail, self.settings.defer)
                live.settled = True
                groups = carried_groups(result.carried, live.requests.values(), live.rule.responses_kept,
                                        live.planned.plan.iteration)
                self.carried.update((group.problem_id, group) for group in groups)

    def _launch(self) -> None:
        while True:
            j = max(self.rounds, default=self.position - 1) + 1
            if j > self.weights_round + self.max_staleness:
                return
            live_problems = {p.problem_id for live in self.rounds.values() for p in live.planned.problems}
            planned = self.plan(self.tail, j, live_problems)
            if j != self.position and self.prompts_in_flight() + planned.plan.num_prompts > self.max_prompts_in_flight:
                return
            self._start(planned)

    def _plan_from_data(self, tail: TailState, j: int, live_problems: AbstractSet[str]) -> PlannedRound:
        """Round j by tail batching's planner; a fresh draw skips prompts earlier rounds still run."""
        return begin_round(tail, j, self.settings, self.problems, self.problems_by_id, live_problems)

    def _start(self, planned: PlannedRound) -> None:
        carried = [self.carried.pop(p.problem_id) for p in planned.problems if p.problem_id in self.carried]
        live = self._add_round(planned, self.version, carried)
        live.is_batch = (not self.is_async and isinstance(live.rule, WaitForAllRule)
                         and not live.observer.watches_each_response)
        self.tail = planned.tail
        if not live.is_batch:
            self.rollout.submit(live.pending())
        done = finished_carried(live.requests, carried) if carried else []
        if done:  # the carried responses that had finished: shown to the new rule as finishing now
            self._observe(planned.plan.iteration, done)
            live.show(done)
            self._settle()

    def _add_round(self, planned: PlannedRound, launched_version: int,
                   carried: list[CarriedGroup] | None = None) -> LiveRound:
        """A live round for `planned`: its seeded requests (continuing `carried`), its rule and its observer
        (launched or replayed)."""
        carried = carried or []
        requests = self.make_requests(planned)
        if carried:
            requests = continued_requests(requests, carried)
        live = LiveRound(planned, {r.request_id: r for r in requests},
                         rule_for(planned.plan, requests, self.settings.continue_deferred),
                         launched_version, self.observe(planned, launched_version), carried=carried)
        self.rounds[planned.plan.iteration] = live
        self.round_of.update((r.request_id, planned.plan.iteration) for r in requests)
        return live

    def prompts_in_flight(self) -> int:
        """Prompts launched and not completed (a completed prompt waits for training, it is not in flight)."""
        return sum(len(live.rule.unfinished_problem_ids()) for live in self.rounds.values() if not live.rule.is_done)

    def _in_flight_ids(self) -> list[str]:
        return [rid for _, live in sorted(self.rounds.items()) for rid in live.rule.in_flight_request_ids()]

    # ---- weight sync -----------------------------------------------------------------------------

    def pause(self) -> int:
        """Stop every request in flight (the engines are then idle and may load weights); returns how many."""
        ids = self._in_flight_ids()
        partials = {c.request_id: c for c in self.rollout.abort(ids)} if ids else {}
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

