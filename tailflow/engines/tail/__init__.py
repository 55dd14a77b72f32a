"""Tail batching (RollPacker): round planning, the long-prompt queue, the completion rule, the one driver.

Pure Python and engine-agnostic. A round's two ends, and the driver between them: round.py.
"""
from tailflow.engines.tail.completion import CompletionRule, RoundResult, WaitForAllRule, rule_for
from tailflow.engines.tail.planner import RoundKind, RoundPlan, launched_prompts, make_round_plan
from tailflow.engines.tail.queue import LongPromptQueue, QueuedPrompt
from tailflow.engines.tail.round import PlannedRound, begin_round, settle_round
from tailflow.engines.tail.state import TailSettings, TailState

__all__ = [
    "CompletionRule",
    "LongPromptQueue",
    "PlannedRound",
    "QueuedPrompt",
    "RoundKind",
    "RoundPlan",
    "RoundResult",
    "TailSettings",
    "TailState",
    "WaitForAllRule",
    "begin_round",
    "launched_prompts",
    "make_round_plan",
    "rule_for",
    "settle_round",
]
