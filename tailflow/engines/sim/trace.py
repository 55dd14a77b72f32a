"""Reading a rollout trace for the simulator: replay its lengths, or draw from its per-prompt pools.

The trace format, its parser and the log runs append to live with the product (engines/track/rollout_trace.py).
"""
from __future__ import annotations

from typing import Sequence

from tailflow.engines.rollout.protocol import FinishReason, Request
from tailflow.engines.sim.lengths import LengthSource, PromptPoolLengths, ResponseLength
from tailflow.engines.track.rollout_trace import TraceRound


def finished_lengths(rounds: Sequence[TraceRound]) -> dict[str, list[int]]:
    """Per prompt, the lengths of its responses that ended by themselves (any round)."""
    pools: dict[str, list[int]] = {}
    for trace_round in rounds:
        for prompt in trace_round.prompts:
            pools.setdefault(prompt.problem_id, []).extend(
                r.length for r in prompt.responses if r.finish != "abort")
    return pools


def imputed_length(partial: int, prompt_lengths: Sequence[int], max_new_tokens: int) -> ResponseLength:
    """An aborted response's length is censored: the prompt's longest finished response if that is longer
    than the partial, else the cap (the rule stopped it, so all we know is that it was still going)."""
    longest = max(prompt_lengths, default=0)
    if longest > partial and longest < max_new_tokens:
        return ResponseLength(longest, FinishReason.EOS)
    return ResponseLength(max_new_tokens, FinishReason.LENGTH)


class TraceLengths(LengthSource):
    """Replay: response k of a problem in round `iteration` gets exactly the length it had in the trace."""

    def __init__(self, rounds: Sequence[TraceRound]) -> None:
        super().__init__()
        self.rounds = {r.iteration: r for r in rounds}
        self.max_new_tokens = max(r.max_new_tokens for r in rounds)
        pools = finished_lengths(rounds)
        self._lengths: dict[tuple[int, str, int], ResponseLength] = {}
        self._prompt_tokens: dict[str, int] = {}
        for trace_round in rounds:
            for prompt in trace_round.prompts:
                self._prompt_tokens[prompt.problem_id] = prompt.prompt_tokens
                for r in prompt.responses:
                    length = (imputed_length(r.length, pools.get(prompt.problem_id, []), trace_round.max_new_tokens)
                              if r.finish == "abort" else ResponseLength(r.length, FinishReason(r.finish)))
                    self._lengths[trace_round.iteration, prompt.problem_id, r.index] = length

    def problem_ids(self) -> list[str]:
        return list(self._prompt_tokens)

    def prompt_tokens(self, problem_id: str) -> int:
        return self._prompt_tokens[problem_id]

    def draw(self, iteration: int, request: Request) -> ResponseLength:
        if iteration not in self.rounds:
            raise KeyError(f"the trace has no round {iteration}")
        try:
            return self._lengths[iteration, request.problem_id, request.index]
        except KeyError:
            raise KeyError(f"round {iteration} of the trace never launched {request.request_id!r}") from None


def pools_from_trace(rounds: Sequence[TraceRound], seed: int = 0, source: str = "trace") -> PromptPoolLengths:
    """Per-prompt pools of finished lengths; aborted (censored) responses are left out, and so are prompts that
    have only those. A deferred prompt's long round finishes all its responses, so its long tail is in."""
    pools = {p: lengths for p, lengths in finished_lengths(rounds).items() if lengths}
    prompt_tokens = {p.problem_id: p.prompt_tokens for r in rounds for p in r.prompts}
    return PromptPoolLengths(pools, prompt_tokens, max(r.max_new_tokens for r in rounds), seed, source)

