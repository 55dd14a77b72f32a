"""Greedy accuracy of the current policy on the held-out problems."""
from __future__ import annotations

import time

from tailflow.engines.evaluation import held_out_accuracy
from tailflow.engines.outcome import Evaluation
from tailflow.engines.run_context import RunContext
from tailflow.tasks.cancellable import run_task


@run_task
def evaluate_policy(ctx: RunContext) -> Evaluation:
    started = time.perf_counter()
    config = ctx.config
    timeout_s = config.reward.timeout_max_s if ctx.reward.runs_code else None
    accuracy = held_out_accuracy(ctx.rollout, ctx.reward_pool, ctx.tokenizer, ctx.eval_problems,
                                 config.data.prompt_template, config.rollout.max_new_tokens, timeout_s)
    return Evaluation(accuracy, time.perf_counter() - started)
