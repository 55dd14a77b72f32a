"""What an agentic (multi-turn) run's metrics, trace and summaries say about its trajectories and environments.

A trajectory's `Completion` carries its tokens after the prompt (model turns and observations), the mask that is
True on the model's tokens, and its `TrajectoryOutcome` (stop reason, turn rewards, environment step seconds).
The environment workers' own counters (`env/worker.py` `EnvCounters`) count what no trajectory shows: failed
calls, invalid actions, observations cut to their byte cap. Everything here is pure (no Ray), and a run without
`env` never reaches it: its rows keep exactly the keys they had.

Per iteration (`env_metrics`):
- over the round's kept trajectories (what the trainer was handed): `env/turns_mean`, `env/turns_max`,
  `env/stop/<reason>` (every `StopReason`, zeros included), `env/dropped` (kept but not trained:
  `TRAINING_RULE` drops their stop, or they hold no model token), `env/groups_dropped` (tasks whose kept group
  has fewer than two trained trajectories: no sample, `train/samples.py`), `env/reward_mean` (what the environments paid,
  over the trained ones: the reward the gradient sees), `token/observation_length/mean` (environment tokens per
  trajectory);
- over every trajectory that ended in the round, kept or not, aborted ones included: `env/stop_all/<reason>`
  and `time/env_step_s_mean` (seconds per environment step, resets excluded);
- from the environment group's counters, the change since the previous iteration read them: `env/failures`
  (failed resets and steps, every reason), `env/invalid_actions`, `env/cut_observations`. They count every
  environment call, not only the round's trajectories': the iteration's evaluation (read after it), iteration 0's
  the initial evaluation too, and, it seems, a step cut short when its trajectory was aborted (its closed environment fails
  the step).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from tailflow.engines.env.trajectory import StopReason
from tailflow.engines.env.worker import EnvCounters
from tailflow.engines.rollout.protocol import Completion
from tailflow.engines.train.samples import is_trained


def model_token_count(completion: Completion) -> int:
    """The tokens the model sampled: all of a single-turn response's, a trajectory's masked-True ones."""
    if not completion.response_mask:
        return len(completion.token_ids)
    return sum(completion.response_mask)


def observation_token_count(completion: Completion) -> int:
    """The environment's tokens in a trajectory (0 for a single-turn response)."""
    return len(completion.token_ids) - model_token_count(completion)


@dataclass(frozen=True)
class TurnTokens:
    model: int
    observation: int


def turn_tokens(completion: Completion) -> list[TurnTokens]:
    """A trajectory's tokens turn by turn, read from its mask: each turn is a run of the model's tokens followed
    by a run of the environment's (empty after the last turn). A turn with no model token (never sampled) cannot
    be seen here: compare the length with `outcome.num_turns`."""
    turns: list[TurnTokens] = []
    model = observation = 0
    for is_model in completion.response_mask:
        if is_model and observation:
            turns.append(TurnTokens(model, observation))
            model = observation = 0
        if is_model:
            model += 1
        else:
            observation += 1
    if model or observation:
        turns.append(TurnTokens(model, observation))
    return turns


def counters_delta(now: EnvCounters, before: EnvCounters) -> EnvCounters:
    """What the environment workers counted between two readings. A worker started again counts from zero, so a
    count that went down is taken as 0 (that worker's earlier counts are lost with it, never negative)."""
    failures = {reason: max(0, count - before.failures.get(reason, 0)) for reason, count in now.failures.items()}
    return EnvCounters(
        resets=max(0, now.resets - before.resets),
        reset_retries=max(0, now.reset_retries - before.reset_retries),
        steps=max(0, now.steps - before.steps),
        failures={reason: count for reason, count in failures.items() if count},
        invalid_actions=max(0, now.invalid_actions - before.invalid_actions),
        cut_observations=max(0, now.cut_observations - before.cut_observations),
        step_seconds=max(0.0, now.step_seconds - before.step_seconds),
        peak_concurrent_calls=now.peak_concurrent_calls,
        active_environments=now.active_environments,
    )


def stop_counts(completions: Sequence[Completion], prefix: str) -> dict[str, int]:
    counts = {f"{prefix}/{reason.value}": 0 for reason in StopReason}
    for completion in completions:
        if completion.outcome is not None:
            counts[f"{prefix}/{completion.outcome.stop_reason.value}"] += 1
    return counts


def groups_dropped(trajectories: Sequence[Completion]) -> int:
    """Tasks among `trajectories` with fewer than two trained ones (their group gives no sample)."""
    trained_of: dict[str, int] = {}
    for completion in trajectories:
        trained_of[completion.problem_id] = trained_of.get(completion.problem_id, 0) + int(is_trained(completion))
    return sum(1 for count in trained_of.values() if count < 2)


def env_metrics(kept: Sequence[Completion], ended: Sequence[Completion], counters: EnvCounters) -> dict[str, Any]:
    """An agentic iteration's `env/*` keys and `token/observation_length/mean` (see the module docstring).
    `kept`: the round's kept responses; `ended`: every response that ended in the round (kept or not, aborted
    partials included); `counters`: the environment group's counts over the iteration (`counters_delta`)."""
    trajectories = [c for c in kept if c.outcome is not None]
    turns = [c.outcome.num_turns for c in trajectories]
    trained = [c for c in trajectories if is_trained(c)]
    steps = [s for c in ended if c.outcome is not None for s in c.outcome.env_step_s[1:]]
    return {
        "env/turns_mean": sum(turns) / len(turns) if turns else 0.0,
        "env/turns_max": max(turns, default=0),
        **stop_counts(kept, "env/stop"),
        **stop_counts(ended, "env/stop_all"),
        "env/dropped": len(trajectories) - len(trained),
        "env/groups_dropped": groups_dropped(trajectories),
        "env/reward_mean": sum(c.outcome.reward for c in trained) / len(trained) if trained else 0.0,
        "time/env_step_s_mean": sum(steps) / len(steps) if steps else 0.0,
        "env/failures": sum(counters.failures.values()),
        "env/invalid_actions": counters.invalid_actions,
        "env/cut_observations": counters.cut_observations,
        "token/observation_length/mean": (sum(observation_token_count(c) for c in trajectories) / len(trajectories)
                                          if trajectories else 0.0),
    }
