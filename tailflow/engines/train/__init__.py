"""GRPO-family training: advantages, losses, batching and the FSDP2 policy trainer.

(The supervised warm start lives in `sft.py`, imported on its own.)
"""
from tailflow.engines.train.advantages import compute_advantages, grpo_advantages, rloo_advantages
from tailflow.engines.train.batch import (
    MicroBatch,
    TrainSample,
    collate,
    count_response_tokens,
    shard_across_ranks,
    split_by_token_budget,
)
from tailflow.engines.train.losses import PPOStats, entropy_from_logits, kl_penalty, ppo_clip_loss, token_logprobs
from tailflow.engines.train.trainer import PolicyTrainer, TrainStepStats

__all__ = [
    "MicroBatch",
    "PPOStats",
    "PolicyTrainer",
    "TrainSample",
    "TrainStepStats",
    "collate",
    "compute_advantages",
    "count_response_tokens",
    "entropy_from_logits",
    "grpo_advantages",
    "kl_penalty",
    "ppo_clip_loss",
    "rloo_advantages",
    "shard_across_ranks",
    "split_by_token_budget",
    "token_logprobs",
]
