"""Where a simulated request's length comes from: a trace, a per-prompt pool, or a generator.

The simulator knows lengths, never tokens: each request is told how many
tokens its response will have and why it stops (EOS, or the length cap). A
source draws per round (`draw(iteration, request)`), because a prompt run
again in a later round (a long round after a deferral) samples new responses;
every draw is a pure function of (seed, iteration, request), so a simulation
is reproducible whatever order the requests arrive in.

Rounds overlap when the pipeline runs ahead of training, and a request
stopped at a weight sync is submitted again later, continuing from its
tokens: so a request's length is drawn once, when its round launches it
(`launch`), and pinned; the engines ask `length_of(request)` at every submit
and get the pinned one.
"""
from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from tailflow.engines.rollout.protocol import FinishReason, Request


@dataclass(frozen=True)
class ResponseLength:
    num_tokens: int
    finish_reason: FinishReason
    """EOS (or STOP) when the model ended it, LENGTH when it reached the cap."""


class RequestLengths(Protocol):
    """What a simulated engine asks at submit."""

    def length_of(self, request: Request) -> ResponseLength: ...


class LengthSource(ABC):
    """A simulated training set: its prompts, their lengths, and each launched response's length."""

    max_new_tokens: int

    def __init__(self) -> None:
        self._pinned: dict[str, ResponseLength] = {}
        """Request id -> the length its latest launch drew."""

    @abstractmethod
    def problem_ids(self) -> list[str]:
        """The prompts this source knows, in dataset order (the simulated training set)."""

    @abstractmethod
    def prompt_tokens(self, problem_id: str) -> int: ...

    @abstractmethod
    def draw(self, iteration: int, request: Request) -> ResponseLength:
        """The length of `request`'s response when round `iteration` launches it."""

    def launch(self, iteration: int, requests: Sequence[Request]) -> None:
        """Round `iteration` launches `requests`: draw and pin their lengths (a request id launched again by a
        later round gets that round's draw)."""
        self._pinned.update((request.request_id, self.draw(iteration, request)) for request in requests)

    def length_of(self, request: Request) -> ResponseLength:
        try:
            return self._pinned[request.request_id]
        except KeyError:
            raise KeyError(f"request {request.request_id!r} was never launched (LengthSource.launch)") from None


def seeded_rng(*parts: object) -> random.Random:
    """A generator seeded by a stable hash of `parts` (no process-dependent hash randomisation)."""
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def capped(num_tokens: int, max_new_tokens: int, natural: FinishReason = FinishReason.EOS) -> ResponseLength:
    """A response of `num_tokens` cut at the cap (then it finishes by LENGTH)."""
    if num_tokens >= max_new_tokens:
        return ResponseLength(max_new_tokens, FinishReason.LENGTH)
    return ResponseLength(max(1, num_tokens), natural)


class PromptPoolLengths(LengthSource):
    """Each prompt has a pool of observed response lengths; a request draws one (with replacement).

    Built from a run's trace (`pools_from_trace`) or RollPacker's per-prompt length logs. Drawing
    rather than replaying lets a plan launch more responses per prompt than the trace recorded.
    """

    def __init__(self, pools: Mapping[str, Sequence[int]], prompt_tokens: Mapping[str, int], max_new_tokens: int,
                 seed: int = 0, source: str = "pool") -> None:
        empty = [p for p, lengths in pools.items() if not lengths]
        if empty:
            raise ValueError(f"{source}: prompts {empty[:3]} have no response lengths")
        super().__init__()
        self.pools = {p: list(lengths) for p, lengths in pools.items()}
        self._prompt_tokens = dict(prompt_tokens)
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.source = source

    def problem_ids(self) -> list[str]:
        return list(self.pools)

    def prompt_tokens(self, problem_id: str) -> int:
        return self._prompt_tokens.get(problem_id, 1)

    def draw(self, iteration: int, request: Request) -> ResponseLength:
        problem_id = request.problem_id
        if problem_id not in self.pools:
            raise KeyError(f"{self.source}: no response lengths for prompt {problem_id!r}")
        rng = seeded_rng("pool", self.seed, iteration, request.request_id)
        return capped(rng.choice(self.pools[problem_id]), min(self.max_new_tokens, request.params.max_new_tokens))
