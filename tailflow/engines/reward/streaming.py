"""Streamed scoring: every response goes to the reward pool the moment its engine finishes it.

The rollout driver hands each finished response to `on_finished` while the
round goes on; when rollout ends, `finish` waits only for what is still
being scored. The reward time a step pays (`time/step_reward`) is that wait.
With `streaming=False` nothing is sent early and `finish` scores the whole
round at once: the batch-after-rollout baseline, on the same pool.

What was hidden: each outcome carries its wall-clock start and end in the
worker; the part of it before rollout ended ran alongside rollout.
`time/reward_overlap_ratio` is that hidden scoring time over all scoring time.
Responses of prompts the round later defers were scored for nothing; they
are counted (`reward/unused_scores`), not used.

A multi-turn trajectory's score (`trajectory_reward`, the config's `env.reward`): `environment`, what its
environment paid (the sum of its turns' rewards), recorded at once without the pool; `verifier`, the reward
function's score of the model's last turn (its final answer) against the problem's reference, as a single-turn
response is scored; `sum`, the two added (the environment's per-turn rewards and penalties on top of the
verifier's; `correct` is the verifier's).
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Literal, Sequence

from tailflow.engines.data.problem import Problem
from tailflow.engines.env.trajectory import StopReason, TrajectoryOutcome
from tailflow.engines.reward.result import RewardResult
from tailflow.engines.reward.scoring import ScoredGroup, ScoredRound, ScoringStats, groups_from_outcomes
from tailflow.engines.reward.worker import ScoreItem, ScoreOutcome
from tailflow.engines.rollout.protocol import Completion, FinishReason

if TYPE_CHECKING:
    from tailflow.config import RunConfig
    from tailflow.engines.cluster.reward_pool import RewardPool

TrajectoryReward = Literal["environment", "verifier", "sum"]


class StreamingScorer:
    """One round's scoring; build a new one per round."""

    def __init__(self, pool: RewardPool, tokenizer, problems: Sequence[Problem],
                 timeout_of: Callable[[Problem], float | None], streaming: bool = True,
                 watcher: Callable[[Sequence[Completion]], None] | None = None,
                 trajectory_reward: TrajectoryReward = "environment") -> None:
        """`watcher` (live progress: driver/live_progress.py) sees every finished response, when streaming;
        `trajectory_reward`: how a multi-turn trajectory is scored (module docstring)."""
        self.pool = pool
        self.tokenizer = tokenizer
        self.problems_by_id = {problem.problem_id: problem for problem in problems}
        self.timeout_of = timeout_of
        self.streaming = streaming
        self._outcomes: dict[str, ScoreOutcome] = {}
        self.texts: dict[str, str] = {}
        """Each response's text, decoded once when it is sent to the reward: its keys are the responses sent."""
        self.watcher = watcher if streaming else None
        self.trajectory_reward = trajectory_reward
        self.environment_rewards: dict[str, float] = {}
        """`sum`: each trajectory's environment reward, added to the verifier's score when it arrives."""

    def item_for(self, completion: Completion) -> ScoreItem:
        problem = self.problems_by_id[completion.problem_id]
        tokens = completion.token_ids if completion.outcome is None else last_turn_tokens(completion)
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        self.texts[completion.request_id] = text
        return ScoreItem(completion.request_id, text, problem, self.timeout_of(problem))

    def on_finished(self, completions: Sequence[Completion]) -> None:
        """Called by the rollout driver with each batch of finished requests (finish order)."""
        if self.watcher is not None:
            self.watcher(completions)
        if not self.streaming:
            return
        items = [self.item_for(c) for c in completions
                 if c.finish_reason is not FinishReason.ABORT and c.request_id not in self.texts]
        self.pool.submit(self._scored_by_environment(items, completions))
        self._collect(self.pool.ready(self.texts.keys() - self._outcomes.keys()))

    def _scored_by_environment(self, items: list[ScoreItem], completions: Sequence[Completion]) -> list[ScoreItem]:
        """The items the reward pool must score: with `environment`, a multi-turn trajectory's score is what its
        environment paid (`TrajectoryOutcome.reward`), recorded here at once; the rest go to the pool."""
        trajectories = {c.request_id: c.outcome for c in completions if c.outcome is not None}
        if self.trajectory_reward != "environment":
            if self.trajectory_reward == "sum":
                self.environment_rewards.update((rid, outcome.reward) for rid, outcome in trajectories.items())
            return items
        now = time.time()
        self._collect([ScoreOutcome(item.request_id, environment_result(trajectories[item.request_id]), now, now)
                       for item in items if item.request_id in trajectories])
        return [item for item in items if item.request_id not in trajectories]

    def scored_group(self, problem_id: str, kept: Sequence[Completion]) -> ScoredGroup | None:
        """A completed prompt's group if every kept response has been scored by the last `on_finished` (which
        collects what arrived, never waiting), else None: what the stream trainer may train during rollout."""
        if any(completion.request_id not in self._outcomes for completion in kept):
            return None
        problem = self.problems_by_id[problem_id]
        return groups_from_outcomes([problem], kept, self._outcomes, self.texts)[0]

    def _collect(self, outcomes: Sequence[ScoreOutcome]) -> None:
        for outcome in outcomes:
            environment = self.environment_rewards.pop(outcome.request_id, None)
            if environment is not None:
                outcome = replace(outcome, result=replace(outcome.result, reward=outcome.result.reward + environment))
            self._outcomes[outcome.request_id] = outcome

    def finish(self, kept: Sequence[Completion]) -> tuple[dict[str, ScoreOutcome], ScoringStats]:
        """Outcomes of the kept completions (scoring any not yet sent), and the round's figures."""
        rollout_ended_at = time.time()
        missing = [self.item_for(c) for c in kept if c.request_id not in self.texts]
        self.pool.submit(self._scored_by_environment(missing, kept))
        self._collect(self.pool.wait_for(self.texts.keys() - self._outcomes.keys()))
        kept_ids = {c.request_id for c in kept}
        outcomes = {request_id: self._outcomes[request_id] for request_id in kept_ids}
        busy = sum(o.seconds for o in self._outcomes.values())
        hidden = sum(max(0.0, min(o.finished_at, rollout_ended_at) - o.started_at)
                     for o in self._outcomes.values())
        stats = ScoringStats(
            busy_s=busy, hidden_s=hidden, num_scored=len(self._outcomes),
            num_unused=len(self._outcomes) - len(kept_ids),
            unused_reward_sum=sum(o.result.reward for r, o in self._outcomes.items() if r not in kept_ids),
            num_timeouts=sum(outcome.result.timeouts for outcome in outcomes.values()),
            workers=self.pool.peak_workers,
        )
        self.pool.shrink_to_recent_need()
        return outcomes, stats

    def score_round(self, problems: Sequence[Problem], completions: Sequence[Completion]) -> ScoredRound:
        """The kept completions' scores (waiting for those still outstanding), grouped by prompt."""
        started = time.perf_counter()
        outcomes, stats = self.finish(completions)
        groups = groups_from_outcomes(problems, completions, outcomes, self.texts)
        return ScoredRound(groups, stats, time.perf_counter() - started)


def trajectory_reward_of(config: RunConfig) -> TrajectoryReward:
    """The run's `env.reward` (`environment` for a single-turn run: never read there)."""
    return config.env.reward if config.env is not None else "environment"


def last_turn_tokens(completion: Completion) -> tuple[int, ...]:
    """A trajectory's last model turn (its final answer), found by its length among the model's tokens (a mask
    run alone cannot tell two turns apart when an observation is empty); () if the model took no turn."""
    lengths = completion.outcome.action_lengths
    if not lengths:
        return ()
    model_tokens = [token for token, is_model in zip(completion.token_ids, completion.response_mask) if is_model]
    return tuple(model_tokens[len(model_tokens) - lengths[-1]:])


def environment_result(outcome: TrajectoryOutcome) -> RewardResult:
    """A trajectory's reward: the sum of its turns' rewards. Correct: it ended DONE with a positive reward (the
    environment said the task is over and paid for it); formatted: it ended DONE."""
    done = outcome.stop_reason is StopReason.DONE
    return RewardResult(reward=outcome.reward, correct=done and outcome.reward > 0, formatted=done)
