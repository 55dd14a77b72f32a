"""How the vLLM engine speaks to vLLM: its engine arguments, a request's sampling parameters, what comes back.

Pure translation (no vLLM import at module level): `vllm_engine.py` uses it, and `tests/test_vllm_engine.py`
checks it by hand and through the real engine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence as Seq

from tailflow.engines.rollout.protocol import FinishReason, Request, SamplingParams
from tailflow.engines.rollout.sequence import ResponseSoFar, eos_ids
from tailflow.engines.rollout.vllm_worker_hooks import PREFIX_DRAWS

CPU_BLOCK_SIZE = 128
"""vLLM's KV-cache block size on its CPU backend (`CpuPlatform.check_and_update_config`)."""

MAX_BATCHED_TOKENS = 16384
"""Tokens one vLLM step may prefill (at least max_seq_len): prompts are never split across steps, so no request
samples (and draws) in a step that only part-prefilled it (the native engine caps a prefill forward alike)."""


def eos_ids_and_vocab_of(model_path: str | Path) -> tuple[tuple[int, ...], int]:
    """EOS ids from the model directory's generation config, else its config (int, list or absent); the vocab size."""
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(model_path)
    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        eos = None
    return eos_ids(eos, config.eos_token_id), config.vocab_size


def kv_cache_bytes(model_path: str | Path, num_slots: int, max_seq_len: int) -> int:
    """What `num_slots` sequences of `max_seq_len` tokens need in fp32 keys and values, in whole CPU blocks
    (the native engine preallocates the same), plus one block. vLLM's CPU backend otherwise reserves a
    fraction of the NUMA node's memory (`gpu_memory_utilization`), gigabytes per engine."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4
    blocks = num_slots * math.ceil(max_seq_len / CPU_BLOCK_SIZE) + 1
    return blocks * CPU_BLOCK_SIZE * per_token


def engine_kwargs(model_path: str | Path, num_slots: int, max_seq_len: int, seed: int, device: str,
                  enable_sleep_mode: bool = False, gpu_memory_utilization: float = 0.85) -> dict:
    """Keyword arguments of vLLM's `EngineArgs` for one engine: on CPU fp32, eager, a KV cache sized for the
    slots; on a GPU bf16 with CUDA graphs and `gpu_memory_utilization` of the device."""
    common = dict(model=str(model_path), seed=seed, max_model_len=max_seq_len, max_num_seqs=num_slots,
                  enable_prefix_caching=True, enable_chunked_prefill=False,
                  max_num_batched_tokens=max(MAX_BATCHED_TOKENS, max_seq_len), logprobs_mode="processed_logprobs",
                  skip_tokenizer_init=True, async_scheduling=False, disable_log_stats=True)
    if device == "cpu":
        return dict(common, dtype="float32", enforce_eager=True,
                    kv_cache_memory_bytes=kv_cache_bytes(model_path, num_slots, max_seq_len))
    return dict(common, dtype="bfloat16", enable_sleep_mode=enable_sleep_mode,
                gpu_memory_utilization=gpu_memory_utilization)


def sampling_kwargs(params: SamplingParams, seed: int, eos_token_ids: Iterable[int], num_prefix_tokens: int) -> dict:
    """Our `SamplingParams` as keyword arguments of vLLM's (output_kind is added by the engine: an enum of
    vLLM's). A continued request keeps its seed and names the draws its prefix took (none when greedy)."""
    stops = list(dict.fromkeys([*eos_token_ids, *params.stop_token_ids]))
    draws = num_prefix_tokens if params.temperature > 0 else 0
    return dict(n=1, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k, seed=seed,
                stop_token_ids=stops, ignore_eos=True, max_tokens=params.max_new_tokens - num_prefix_tokens,
                logprobs=0, detokenize=False, extra_args={PREFIX_DRAWS: draws} if draws else None)


def sampled_logprobs(token_ids: Seq[int], positions: Seq[Mapping[int, Any]] | None) -> list[float]:
    """The log-prob of each sampled token from vLLM's per-position dicts (token id -> `Logprob`)."""
    if positions is None or len(positions) != len(token_ids):
        raise RuntimeError(f"vLLM returned {len(token_ids)} tokens with "
                           f"{'no' if positions is None else len(positions)} log-prob positions; this engine needs "
                           "one per token (logprobs=0)")
    return [position[token].logprob for token, position in zip(token_ids, positions)]


def finish_reason_of(vllm_reason: str | None, token_ids: Seq[int], eos_token_ids: frozenset[int],
                     request_id: str) -> FinishReason | None:
    """vLLM's finish reason string as ours: `stop` is EOS when the last token is an EOS id, else STOP."""
    if vllm_reason is None:
        return None
    if vllm_reason == "stop":
        return FinishReason.EOS if token_ids and token_ids[-1] in eos_token_ids else FinishReason.STOP
    if vllm_reason == "length":
        return FinishReason.LENGTH
    if vllm_reason == "abort":
        return FinishReason.ABORT
    raise RuntimeError(f"request {request_id!r}: vLLM finished it with reason {vllm_reason!r}")


@dataclass(frozen=True)
class VllmCalls:
    """The two vLLM constructors the engine calls per request."""

    sampling_params: Callable[..., Any]
    prompt: Callable[[list[int]], Any]

    @classmethod
    def from_vllm(cls) -> "VllmCalls":
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind

        def sampling_params(**kwargs):
            return VllmSamplingParams(output_kind=RequestOutputKind.DELTA, **kwargs)

        return cls(sampling_params, tokens_input)


class InFlight(ResponseSoFar):
    """One request inside the engine: its response so far (a continued request starts from its prefix)."""

    def __init__(self, request: Request, arrival_index: int, engine_seed: int) -> None:
        super().__init__(request, arrival_index, engine_seed)
        self.num_prefix_tokens = len(self.token_ids)
