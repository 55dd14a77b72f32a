"""Where a simulated request's length comes from: a trace, a per-prompt pool, or the generator.

The simulator knows lengths, never tokens: each request is told how many
tokens its response will have and why it stops (EOS, or the length cap). A
source answers per round (`begin_round(iteration)`), because a prompt run
again in a later round (a long round after a deferral) samples new responses.
Every draw is a pure function of (seed, iteration, request id), so a
simulation is reproducible whatever order the requests arrive in.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from tailflow.engines.rollout.protocol import FinishReason, Request


@dataclass(frozen=True)
class ResponseLength:
    num_tokens: int
    finish_reason: FinishReason
    """EOS (or STOP) when the model ended it, LENGTH when it reached the cap."""


class LengthSource(Protocol):
    max_new_tokens: int

    def problem_ids(self) -> list[str]:
        """The prompts this source knows, in dataset order (the simulated training set)."""

    def prompt_tokens(self, problem_id: str) -> int: ...

    def begin_round(self, iteration: int) -> None: ...

    def length_of(self, request: Request) -> ResponseLength: ...


def seeded_rng(*parts: object) -> random.Random:
    """A generator seeded by a stable hash of `parts` (no process-dependent hash randomisation)."""
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def capped(num_tokens: int, max_new_tokens: int, natural: FinishReason = FinishReason.EOS) -> ResponseLength:
    """A response of `num_tokens` cut at the cap (then it finishes by LENGTH)."""
    if num_tokens >= max_new_tokens:
        return ResponseLength(max_new_tokens, FinishReason.LENGTH)
    return ResponseLength(max(1, num_tokens), natural)


class PromptPoolLengths:
    """Each prompt has a pool of observed response lengths; a request draws one (with replacement).

    Built from a run's trace (`pools_from_trace`) or RollPacker's per-prompt length logs. Drawing
    rather than replaying lets a plan launch more responses per prompt than the trace recorded.
    """

    def __init__(self, pools: Mapping[str, Sequence[int]], prompt_tokens: Mapping[str, int], max_new_tokens: int,
                 seed: int = 0, source: str = "pool") -> None:
        empty = [p for p, lengths in pools.items() if not lengths]
        if empty:
            raise ValueError(f"{source}: prompts {empty[:3]} have no response lengths")
        self.pools = {p: list(lengths) for p, lengths in pools.items()}
        self._prompt_tokens = dict(prompt_tokens)
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.source = source
        self.iteration = 0

    def problem_ids(self) -> list[str]:
        return list(self.pools)

    def prompt_tokens(self, problem_id: str) -> int:
        return self._prompt_tokens.get(problem_id, 1)

    def begin_round(self, iteration: int) -> None:
        self.iteration = iteration

    def length_of(self, request: Request) -> ResponseLength:
        problem_id = request.problem_id
        if problem_id not in self.pools:
            raise KeyError(f"{self.source}: no response lengths for prompt {problem_id!r}")
        rng = seeded_rng("pool", self.seed, self.iteration, request.request_id)
        return capped(rng.choice(self.pools[problem_id]), min(self.max_new_tokens, request.params.max_new_tokens))
