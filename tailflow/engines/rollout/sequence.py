"""One request's state inside the engine, and the rule that says it is done."""
from __future__ import annotations

from enum import Enum
from typing import Iterable, Sequence as Seq

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


def eos_ids(generation_eos: int | Seq[int] | None, config_eos: int | Seq[int] | None) -> tuple[int, ...]:
    """EOS ids from the generation config, else the model config (each an int, a list or None)."""
    eos = config_eos if generation_eos is None else generation_eos
    if eos is None:
        return ()
    return (eos,) if isinstance(eos, int) else tuple(eos)


def check_requests(requests: Iterable[Request], in_flight_ids: Iterable[str], vocab_size: int,
                   max_seq_len: int) -> None:
    """Refuse a batch before any of it is queued (the native and vLLM engines' `submit`): a request id already
    in flight or earlier in the batch, an empty prompt, token ids outside the vocabulary, a prefix that is
    already finished, prompt + max_new_tokens over the engine's `max_seq_len`."""
    seen = set(in_flight_ids)
    for request in requests:
        rid, prompt, prefix, params = request.request_id, request.prompt_token_ids, request.prefix, request.params
        if rid in seen:
            raise ValueError(f"request {rid!r}: duplicate request id (already in flight or twice in this call)")
        if not prompt:
            raise ValueError(f"request {rid!r}: empty prompt")
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            raise ValueError(f"request {rid!r}: prompt token ids must be in [0, {vocab_size})")
        if prefix is not None:
            if prefix.outcome is not None:
                raise ValueError(f"request {rid!r}: its prefix is a multi-turn trajectory's, which only a "
                                 "TrajectoryEngine continues (it replays the turns into the environment first)")
            if len(prefix.token_ids) >= params.max_new_tokens:
                raise ValueError(f"request {rid!r}: its prefix of {len(prefix.token_ids)} tokens already reaches "
                                 f"max_new_tokens ({params.max_new_tokens}): it is finished, not in flight")
            if prefix.token_ids and (min(prefix.token_ids) < 0 or max(prefix.token_ids) >= vocab_size):
                raise ValueError(f"request {rid!r}: prefix token ids must be in [0, {vocab_size})")
        needed = len(prompt) + params.max_new_tokens
        if needed > max_seq_len:
            raise ValueError(f"request {rid!r}: prompt ({len(prompt)}) + max_new_tokens ({params.max_new_tokens}) "
                             f"= {needed} exceeds the engine's max_seq_len {max_seq_len}")
        seen.add(rid)


def refuse_in_flight(refused: str, num_running: int, num_waiting: int, because: str) -> None:
    """Both engines' refusal of `refused` (load_weights, sleep) while requests are in flight."""
    if num_running or num_waiting:
        raise RuntimeError(f"{refused} refused: {num_running} running and {num_waiting} waiting requests {because}; "
                           "finish or abort them first")


class ResponseSoFar:
    """A request plus the response it has so far (a continued request starts from its prefix) and its sampler's
    seed (`SamplingParams.seed`): what both engines hold per request in flight."""

    def __init__(self, request: Request, arrival_index: int, engine_seed: int) -> None:
        prefix, seed = request.prefix, request.params.seed
        self.request = request
        self.request_id = request.request_id
        self.seed = seed if seed is not None else derive_seed(engine_seed, arrival_index)
        self.token_ids: list[int] = list(prefix.token_ids) if prefix else []
        self.logprobs: list[float] = list(prefix.logprobs) if prefix else []
        self.weight_versions: list[int] = list(prefix.weight_versions) if prefix else []

    def ends_with_stop_sequence(self) -> bool:
        tokens = self.token_ids
        return any(0 < len(stop) <= len(tokens) and tuple(tokens[-len(stop):]) == tuple(stop)
                   for stop in self.request.params.stop_sequences)

    def to_completion(self, reason: FinishReason, weight_version: int) -> Completion:
        mixed = any(version != weight_version for version in self.weight_versions)
        return self.request.completion(tuple(self.token_ids), tuple(self.logprobs), reason, weight_version,
                                       tuple(self.weight_versions) if mixed else ())


class Sequence(ResponseSoFar):
    """A request plus what it has produced so far.

    `num_cached` counts positions whose keys/values are in the cache; the last
    known token (`last_token_id`) is not yet cached: the next decode feeds it.
    """

    def __init__(self, request: Request, arrival_index: int, engine_seed: int) -> None:
        super().__init__(request, arrival_index, engine_seed)
        self.params = request.params
        self.status = SequenceStatus.WAITING
        self.num_cached = 0
        self.kept_kv: tuple[int, torch.Tensor, torch.Tensor] | None = None
        """(positions, keys, values) taken from the kept slot this request continues, until its prefill."""
        self.generator = torch.Generator().manual_seed(self.seed)
        if self.params.temperature > 0:  # the draws the prefix's tokens took (sampler.make_batch: one per token)
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
        if token in self.params.stop_token_ids or self.ends_with_stop_sequence():
            return FinishReason.STOP
        if len(self.token_ids) >= self.params.max_new_tokens:
            return FinishReason.LENGTH
        return None
