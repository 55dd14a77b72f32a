"""Reading a rollout trace for the simulator: draw from its per-prompt pools (bench/research/replay.py replays it),
or, from an agentic run's trace, resample its trajectories (`agentic.py`: `tailflow plan --env-trace`).

The trace format, its parser and the log runs append to live with the product (engines/track/rollout_trace.py).
"""
from __future__ import annotations

import random
from typing import Sequence

from tailflow.engines.sim.agentic import SimTrajectory, SimTurn
from tailflow.engines.sim.lengths import PromptPoolLengths
from tailflow.engines.track.rollout_trace import TraceError, TraceRound


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


def trajectories_from_trace(rounds: Sequence[TraceRound], source: str = "trace") -> list[SimTrajectory]:
    """An agentic run's trajectories as the simulator's (`agentic.py`): each one's prompt, reset time and turns
    (model tokens, observation tokens, environment step seconds). Aborted ones (cut short: their turns are a lower
    bound) and ones whose turn counts the trace could not split (a turn of 0 model tokens) are left out."""
    trajectories = [SimTrajectory(tuple(SimTurn(t.model_tokens, t.observation_tokens, t.env_s) for t in r.turns),
                                  prompt.prompt_tokens, r.env_reset_s or 0.0)
                    for trace_round in rounds for prompt in trace_round.prompts for r in prompt.responses
                    if r.turns and r.stop != "abort" and min(t.model_tokens for t in r.turns) >= 1]
    if not trajectories:
        raise TraceError(f"{source}: no multi-turn trajectories that ended by themselves (--env-trace needs the "
                         "rollout trace of an agentic run, one with an `env` section)")
    return trajectories


def sample_trajectories(trajectories: Sequence[SimTrajectory], num: int, seed: int = 0) -> list[SimTrajectory]:
    """`num` whole trajectories drawn with replacement (seeded): a trajectory's turn count and its environment's
    step times stay together."""
    rng = random.Random(seed)
    return [rng.choice(trajectories) for _ in range(num)]
