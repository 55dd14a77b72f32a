"""Greedy held-out accuracy: one response per problem at temperature 0, scored by the run's reward workers.

The one evaluation path, used by the training run (before it starts and every
`train.eval_every` iterations) and by `tailflow eval`. Code runs with the
fixed `reward.timeout_max_s`, so accuracy never depends on the anchors the
run has learned.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from tailflow.engines.data.problem import Problem
from tailflow.engines.reward.streaming import StreamingScorer, trajectory_reward_of
from tailflow.engines.rollout.requests import greedy_requests

if TYPE_CHECKING:
    from tailflow.config import RunConfig
    from tailflow.engines.cluster.reward_pool import RewardPool
    from tailflow.engines.cluster.rollout_group import RolloutGroup


def held_out_accuracy(rollout: RolloutGroup, pool: RewardPool, tokenizer, problems: Sequence[Problem],
                      config: RunConfig, runs_code: bool) -> float:
    timeout_s = config.reward.timeout_max_s if runs_code else None
    requests = greedy_requests(problems, config.rollout.max_new_tokens, tokenizer, config.data.prompt_template)
    completions = rollout.generate(requests)
    scorer = StreamingScorer(pool, tokenizer, problems, lambda problem: timeout_s, streaming=False,
                             trajectory_reward=trajectory_reward_of(config))
    scored = scorer.score_round(problems, completions)
    return sum(group.responses[0].correct for group in scored.groups) / len(scored.groups)
