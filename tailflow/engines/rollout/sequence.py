"""One request's state inside the engine, and the rule that says it is done."""
from __future__ import annotations

from enum import Enum

import torch

from tailflow.engines.rollout.protocol import Completion, FinishReason, Request

SEED_MODULUS = 2**63 - 1


def derive_seed(engine_seed: int, arrival_index: int) -> int:
    """A request seed from the engine seed and arrival order only (no clock, no hash randomisation)."""
    return (engine_seed * 1_000_003 + arrival_index * 7_919 + 1) % SEED_MODULUS


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """A request plus what it has produced so far.

    `num_cached` counts positions whose keys/values are in the cache; the last
    known token (`last_token_id`) is not yet cached: the next decode feeds it.
    """

    def __init__(self, request: Request, arrival_index: int, engine_seed: int) -> None:
        params = request.params
        self.request = request
        self.request_id = request.request_id
        self.params = params
        self.status = SequenceStatus.WAITING
        prefix = request.prefix
        self.token_ids: list[int] = list(prefix.token_ids) if prefix else []
        self.logprobs: list[float] = list(prefix.logprobs) if prefix else []
        self.weight_versions: list[int] = list(prefix.weight_versions) if prefix else []
        self.num_cached = 0
        seed = params.seed if params.seed is not None else derive_seed(engine_seed, arrival_index)
        self.generator = torch.Generator().manual_seed(seed)
        if params.temperature > 0:  # the draws the prefix's tokens took (sampler.make_batch: one per token)
            for _ in self.token_ids:
                torch.rand(1, generator=self.generator)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def context_token_ids(self) -> list[int]:
        """Prompt and response so far: what a (re-)prefill caches, all but the last token."""
        return [*self.request.prompt_token_ids, *self.token_ids]

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1] if self.token_ids else self.request.prompt_token_ids[-1]

    def append(self, token_id: int, logprob: float, weight_version: int) -> None:
        """Record a sampled token; the token it was fed (the previous last token) is now cached."""
        self.token_ids.append(token_id)
        self.logprobs.append(logprob)
        self.weight_versions.append(weight_version)
        self.num_cached += 1

    def finish_reason(self, eos_token_ids: frozenset[int]) -> FinishReason | None:
        """EOS beats a stop token/sequence, which beats the length limit; None while still running."""
        token = self.token_ids[-1]
        if token in eos_token_ids:
            return FinishReason.EOS
        if token in self.params.stop_token_ids or self._ends_with_stop_sequence():
            return FinishReason.STOP
        if len(self.token_ids) >= self.params.max_new_tokens:
            return FinishReason.LENGTH
        return None

    def _ends_with_stop_sequence(self) -> bool:
        tokens = self.token_ids
        return any(
            len(stop) > 0 and len(tokens) >= len(stop) and tuple(tokens[-len(stop):]) == tuple(stop)
            for stop in self.params.stop_sequences
        )

    def to_completion(self, reason: FinishReason, weight_version: int) -> Completion:
        mixed = any(version != weight_version for version in self.weight_versions)
        return self.request.completion(tuple(self.token_ids), tuple(self.logprobs), reason, weight_version,
                                       tuple(self.weight_versions) if mixed else ())
