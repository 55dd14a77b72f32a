"""Reading a rollout trace for the simulator: draw from its per-prompt pools (bench/research/replay.py replays it).

The trace format, its parser and the log runs append to live with the product (engines/track/rollout_trace.py).
"""
from __future__ import annotations

from typing import Sequence

from tailflow.engines.sim.lengths import PromptPoolLengths
from tailflow.engines.track.rollout_trace import TraceRound


def finished_lengths(rounds: Sequence[TraceRound]) -> dict[str, list[int]]:
    """Per prompt, the lengths of its responses that ended by themselves (any round)."""
    pools: dict[str, list[int]] = {}
    for trace_round in rounds:
        for prompt in trace_round.prompts:
            pools.setdefault(prompt.problem_id, []).extend(
                r.length for r in prompt.responses if r.finish != "abort")
    return pools


def pools_from_trace(rounds: Sequence[TraceRound], seed: int = 0, source: str = "trace") -> PromptPoolLengths:
    """Per-prompt pools of finished lengths; aborted (censored) responses are left out, and so are prompts that
    have only those. A deferred prompt's long round finishes all its responses, so its long tail is in."""
    pools = {p: lengths for p, lengths in finished_lengths(rounds).items() if lengths}
    prompt_tokens = {p.problem_id: p.prompt_tokens for r in rounds for p in r.prompts}
    return PromptPoolLengths(pools, prompt_tokens, max(r.max_new_tokens for r in rounds), seed, source)

