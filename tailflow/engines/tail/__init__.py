"""Tail batching (RollPacker): round planning, the long-prompt queue, the completion rule.

Pure Python and engine-agnostic: the caller plans a round, launches its
requests, feeds finished completions to the round's rule, aborts what the rule
says, and finally defers the rule's unfinished prompts to the queue.
"""
from tailflow.engines.tail.completion import (
    CompletionRule,
    RoundResult,
    ShortRoundResult,
    WaitForAllRule,
    rule_for,
)
from tailflow.engines.tail.planner import RoundKind, RoundPlan, launched_prompts, plan_round
from tailflow.engines.tail.queue import LongPromptQueue, QueuedPrompt

__all__ = [
    "CompletionRule",
    "LongPromptQueue",
    "QueuedPrompt",
    "RoundKind",
    "RoundPlan",
    "RoundResult",
    "ShortRoundResult",
    "WaitForAllRule",
    "launched_prompts",
    "plan_round",
    "rule_for",
]
