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
    accuracy = held_out_accuracy(ctx.rollout, ctx.reward_pool, ctx.tokenizer, ctx.eval_problems, ctx.config,
                                 ctx.reward.runs_code)
    return Evaluation(accuracy, time.perf_counter() - started)
