"""A rollout engine on vLLM (`rollout.engine: vllm`, the `vllm` extra, pinned to vllm==0.33.0).

Written against vLLM 0.33.0's Python API as read in that release's wheel
(`vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl`, unpacked, not installed).
**It has never run**: no machine this was written on had vLLM or a GPU, and the
vLLM wheel (336 MB, with its own CUDA torch) does not fit what the lent GPU
machine can be given. Only the translation functions and the engine's
bookkeeping ran, on a CPU, against stand-ins shaped like vLLM's records
(`tests/test_vllm_engine.py`). The calls used, each checked in 0.33.0's source:

- `vllm.engine.arg_utils.EngineArgs(model=, seed=, dtype=, max_model_len=, max_num_seqs=,
  gpu_memory_utilization=, enable_prefix_caching=, logprobs_mode=, enable_sleep_mode=, skip_tokenizer_init=,
  async_scheduling=, disable_log_stats=)` and `vllm.v1.engine.llm_engine.LLMEngine.from_engine_args(engine_args,
  enable_multiprocessing=False)`; that method turns multiprocessing back on when the environment variable
  `VLLM_ENABLE_V1_MULTIPROCESSING` is 1 (its default, `vllm/envs.py`), so `from_pretrained` sets it to 0 first:
  the engine core then runs in this process (`InprocClient`), where `apply_model` reaches the model directly.
- `LLMEngine.add_request(request_id: str, prompt, params)`, with `prompt` =
  `vllm.inputs.tokens_input(prompt_token_ids)` (a `TokensInput` dict, `type: "token"`; raw prompts still work
  but log a deprecation in `InputProcessor.process_inputs`).
- `LLMEngine.step() -> list[RequestOutput]`; `RequestOutput.request_id` is the id we passed (vLLM appends a
  random suffix internally and maps it back), `.outputs[0]` a `CompletionOutput` with `token_ids`, `logprobs`
  (`list[dict[int, Logprob]]`, one dict per new token, the sampled token always among its keys; `Logprob.logprob`
  a float) and `finish_reason` (`"stop"`, `"length"`, `"abort"`, `"error"`, `"repetition"`, or None).
  `output_kind=RequestOutputKind.DELTA` makes each step's output hold only that step's new tokens.
- `LLMEngine.abort_request(request_ids: list[str], internal: bool = False)`,
  `has_unfinished_requests()`, `get_num_unfinished_requests()`, `reset_prefix_cache()`.
- `LLMEngine.apply_model(func)` -> `collective_rpc("apply_model", args=(func,))` -> on each worker
  `func(model)`, in this process (`UniProcExecutor.collective_rpc` -> `run_method`, no pickling), `model` the
  raw module (`GPUModelRunner.get_model` unwraps its CUDA-graph wrapper); the model's `load_weights(weights: Iterable[tuple[str, Tensor]]) -> set[str]` (Qwen2, Qwen3,
  Llama: `AutoWeightsLoader`, Hugging Face names in, vLLM's fused names out).
- `LLMEngine.sleep(level: int = 1, mode="abort")`, `wake_up(tags: list[str] | None = None) -> bool` (True when
  fully awake); level 2 discards weights and KV cache, `wake_up(["weights"])` maps weight memory back without
  contents, `wake_up(["kv_cache"])` the rest (`vllm/v1/engine/core.py`, `vllm/device_allocator/cumem.py`).
- `SamplingParams(n=1, temperature=, top_p=, top_k=, seed=, stop_token_ids=, ignore_eos=, max_tokens=,
  logprobs=, detokenize=, output_kind=)`.

Log-probs. vLLM 0.33 reports, with `logprobs_mode="raw_logprobs"` (its default, set explicitly here), the
fp32 `log_softmax` of the model's logits before temperature, top-k/top-p and penalties (`vllm/v1/sample/
sampler.py`: `compute_logprobs` runs before any processor), so the log-prob of the sampled token is exactly
our contract's: temperature 1, raw model. (`processed_logprobs` would be after temperature and filtering;
not used.) One 0.33 path returns no log-probs at all (`mixed_sample_eligible`, the ROCm aiter sampler):
this engine refuses an output without them rather than invent numbers.

Differences from the native engine, by design of what vLLM exposes:
- EOS: vLLM's own EOS handling is off (`ignore_eos=True`) and the model config's EOS ids are passed as stop
  tokens with the request's own; the finish reason is then ours (EOS beats STOP, as in `sequence.py`).
- Stop sequences of token ids: vLLM stops on strings or single ids only, so this engine checks each new token
  and aborts the request in vLLM the moment a sequence completes.
- Seeds: vLLM seeds each request's sampler from `SamplingParams.seed`, but its draws cannot be advanced past
  a `ResponsePrefix`; a continued request is seeded from (seed, prefix length) instead, so it is reproducible
  but does not draw what the uninterrupted request would have (the native engine does).
- A request without a seed gets one derived from the engine seed and its arrival index (`derive_seed`).
- `num_running` counts in-flight requests that have produced a token here, `num_waiting` the rest: vLLM's
  public API does not say which requests its scheduler holds.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence as Seq

import torch

from tailflow.engines.rollout.protocol import Completion, EngineStats, FinishReason, Request, SamplingParams
from tailflow.engines.rollout.sequence import SEED_MODULUS, derive_seed

VLLM_VERSION = "0.33.0"
"""The release this module was written against (pyproject's `vllm` extra pins it)."""


def eos_ids_and_vocab_of(model_path: str | Path) -> tuple[tuple[int, ...], int]:
    """EOS ids from the model directory's generation config, else its config (int, list or absent); the vocab size."""
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(model_path)
    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        eos = None
    if eos is None:
        eos = config.eos_token_id
    eos_ids = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
    return eos_ids, config.vocab_size


def continued_seed(seed: int, num_prefix_tokens: int) -> int:
    """The seed of a request continued after `num_prefix_tokens` tokens (the seed itself when there are none)."""
    if num_prefix_tokens == 0:
        return seed
    return (seed * 1_000_033 + num_prefix_tokens * 104_729 + 7) % SEED_MODULUS


def sampling_kwargs(params: SamplingParams, seed: int, eos_token_ids: Iterable[int], num_prefix_tokens: int) -> dict:
    """Our `SamplingParams` as keyword arguments of vLLM 0.33's `SamplingParams` (output_kind added by the
    engine: it is an enum of vLLM's). Stop sequences are not among them: the engine checks those itself."""
    stops = list(dict.fromkeys([*eos_token_ids, *params.stop_token_ids]))
    return dict(n=1, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                seed=continued_seed(seed, num_prefix_tokens), stop_token_ids=stops, ignore_eos=True,
                max_tokens=params.max_new_tokens - num_prefix_tokens, logprobs=0, detokenize=False)


def engine_kwargs(model_path: str | Path, num_slots: int, max_seq_len: int, seed: int, enable_sleep_mode: bool,
                  gpu_memory_utilization: float) -> dict:
    """Keyword arguments of vLLM 0.33's `EngineArgs` for one engine on one GPU."""
    return dict(model=str(model_path), seed=seed, dtype="bfloat16", max_model_len=max_seq_len,
                max_num_seqs=num_slots, gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=True,
                logprobs_mode="raw_logprobs", enable_sleep_mode=enable_sleep_mode, skip_tokenizer_init=True,
                async_scheduling=False, disable_log_stats=True)


def sampled_logprobs(token_ids: Seq[int], positions: Seq[Mapping[int, Any]] | None) -> list[float]:
    """The log-prob of each sampled token from vLLM's per-position dicts (token id -> `Logprob`)."""
    if positions is None or len(positions) != len(token_ids):
        raise RuntimeError(f"vLLM returned {len(token_ids)} tokens with "
                           f"{'no' if positions is None else len(positions)} log-prob positions; this engine needs "
                           "one per token (logprobs=0, logprobs_mode raw_logprobs)")
    return [position[token].logprob for token, position in zip(token_ids, positions)]


@dataclass(frozen=True)
class VllmCalls:
    """The two vLLM constructors the engine calls per request (tests pass plain stand-ins)."""

    sampling_params: Callable[..., Any]
    prompt: Callable[[list[int]], Any]

    @classmethod
    def from_vllm(cls) -> "VllmCalls":
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind

        return cls(functools.partial(VllmSamplingParams, output_kind=RequestOutputKind.DELTA), tokens_input)


class InFlight:
    """One request inside the engine: its response so far (a continued request starts from its prefix)."""

    def __init__(self, request: Request) -> None:
        prefix = request.prefix
        self.request = request
        self.token_ids: list[int] = list(prefix.token_ids) if prefix else []
        self.logprobs: list[float] = list(prefix.logprobs) if prefix else []
        self.weight_versions: list[int] = list(prefix.weight_versions) if prefix else []
        self.num_generated = 0

    def ends_with_stop_sequence(self) -> bool:
        tokens = self.token_ids
        return any(0 < len(stop) <= len(tokens) and tuple(tokens[-len(stop):]) == tuple(stop)
                   for stop in self.request.params.stop_sequences)

    def to_completion(self, reason: FinishReason, weight_version: int) -> Completion:
        mixed = any(version != weight_version for version in self.weight_versions)
        return self.request.completion(tuple(self.token_ids), tuple(self.logprobs), reason, weight_version,
                                       tuple(self.weight_versions) if mixed else ())


def load_hf_weights(named_tensors: list[tuple[str, torch.Tensor]], model: torch.nn.Module) -> list[str]:
    """Runs inside vLLM's worker (`apply_model`): load Hugging Face-named tensors; the parameters left unloaded.
    (vLLM's own loader refuses a checkpoint that leaves any parameter unloaded; so does this engine.)"""
    loaded = model.load_weights(named_tensors)
    return sorted(set(dict(model.named_parameters())) - set(loaded))


class VllmEngine:
    """A `RolloutEngine` over one in-process vLLM `LLMEngine` (one GPU, tensor parallel 1)."""

    def __init__(self, llm_engine: Any, num_slots: int, max_seq_len: int, eos_token_ids: Iterable[int],
                 vocab_size: int, seed: int = 0, weight_version: int = 0, calls: VllmCalls | None = None) -> None:
        self.llm = llm_engine
        self.vocab_size = vocab_size
        self.calls = calls or VllmCalls.from_vllm()
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.seed = seed
        self.weight_version = weight_version
        self.in_flight: dict[str, InFlight] = {}
        self.num_arrived = 0
        self.num_steps = 0
        self.num_busy_slot_steps = 0
        self.num_tokens_generated = 0
        self.is_sleeping = False
        self.has_weights = True
        """False between a sleep (level 2 discards the weights) and the next load_weights."""

    @classmethod
    def from_pretrained(cls, path: str | Path, num_slots: int, max_seq_len: int, seed: int = 0,
                        enable_sleep_mode: bool = False, gpu_memory_utilization: float = 0.85) -> "VllmEngine":
        """Build vLLM's engine in this process on the GPU this process was given (Ray sets CUDA_VISIBLE_DEVICES)."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine core: apply_model reaches the model
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        kwargs = engine_kwargs(path, num_slots, max_seq_len, seed, enable_sleep_mode, gpu_memory_utilization)
        args = EngineArgs(**kwargs)
        llm_engine = LLMEngine.from_engine_args(args, enable_multiprocessing=False)
        eos_token_ids, vocab_size = eos_ids_and_vocab_of(path)
        return cls(llm_engine, num_slots, max_seq_len, eos_token_ids, vocab_size, seed)

    # ---- requests in -------------------------------------------------------------------------

    def submit(self, requests: Seq[Request]) -> None:
        """Hand requests to vLLM in order; all are validated before any is added."""
        self._check_awake("submit")
        seen = set(self.in_flight)
        for request in requests:
            self._validate(request, seen)
            seen.add(request.request_id)
        for request in requests:
            self._add(request)

    def _validate(self, request: Request, seen: set[str]) -> None:
        rid, prefix, params = request.request_id, request.prefix, request.params
        if rid in seen:
            raise ValueError(f"request {rid!r}: duplicate request id (already in flight or twice in this call)")
        if not request.prompt_token_ids:
            raise ValueError(f"request {rid!r}: empty prompt")
        context = (*request.prompt_token_ids, *(prefix.token_ids if prefix else ()))
        if any(not 0 <= token < self.vocab_size for token in context):
            raise ValueError(f"request {rid!r}: prompt and prefix token ids must be in [0, {self.vocab_size})")
        if prefix is not None and len(prefix.token_ids) >= params.max_new_tokens:
            raise ValueError(f"request {rid!r}: its prefix of {len(prefix.token_ids)} tokens already reaches "
                             f"max_new_tokens ({params.max_new_tokens}): it is finished, not in flight")
        needed = len(request.prompt_token_ids) + params.max_new_tokens
        if needed > self.max_seq_len:
            raise ValueError(f"request {rid!r}: prompt ({len(request.prompt_token_ids)}) + max_new_tokens "
                             f"({params.max_new_tokens}) = {needed} exceeds the engine's max_seq_len "
                             f"{self.max_seq_len}")

    def _add(self, request: Request) -> None:
        seq = InFlight(request)
        seed = request.params.seed if request.params.seed is not None else derive_seed(self.seed, self.num_arrived)
        kwargs = sampling_kwargs(request.params, seed, self.eos_token_ids, len(seq.token_ids))
        prompt = self.calls.prompt([*request.prompt_token_ids, *seq.token_ids])
        self.llm.add_request(request.request_id, prompt, self.calls.sampling_params(**kwargs))
        self.in_flight[request.request_id] = seq
        self.num_arrived += 1

    # ---- the loop ----------------------------------------------------------------------------

    def step(self) -> list[Completion]:
        """One vLLM step; the completions it finished (or that hit a stop sequence), in vLLM's output order."""
        self._check_awake("step")
        finished = []
        num_rows = 0
        for output in self.llm.step():
            seq = self.in_flight.get(output.request_id)
            if seq is None:
                continue  # aborted by us after vLLM had produced this output
            num_rows += 1
            reason = self._append(seq, output.outputs[0])
            if reason is not None:
                finished.append(seq.to_completion(reason, self.weight_version))
                del self.in_flight[seq.request.request_id]
        if num_rows:
            self.num_steps += 1
            self.num_busy_slot_steps += num_rows
        return finished

    def _append(self, seq: InFlight, delta: Any) -> FinishReason | None:
        """Add one output's new tokens; the finish reason if the request is done."""
        new_ids = list(delta.token_ids)
        for token, logprob in zip(new_ids, sampled_logprobs(new_ids, delta.logprobs)):
            seq.token_ids.append(token)
            seq.logprobs.append(logprob)
            seq.weight_versions.append(self.weight_version)
            seq.num_generated += 1
            self.num_tokens_generated += 1
            if seq.ends_with_stop_sequence() and token not in self.eos_token_ids:
                if delta.finish_reason is None:
                    self.llm.abort_request([seq.request.request_id])
                return FinishReason.STOP
        return finish_reason_of(delta.finish_reason, seq.token_ids, self.eos_token_ids, seq.request.request_id)

    def generate(self, requests: Seq[Request]) -> list[Completion]:
        self.submit(requests)
        completions = []
        while self.has_unfinished():
            completions.extend(self.step())
        return completions

    # ---- control -----------------------------------------------------------------------------

    def abort(self, request_ids: Seq[str]) -> list[Completion]:
        """Stop these requests in vLLM now; their partial completions (ABORT) in the order asked, unknown ids
        ignored."""
        wanted = [rid for rid in dict.fromkeys(request_ids) if rid in self.in_flight]
        if wanted:
            self.llm.abort_request(wanted)
        return [self.in_flight.pop(rid).to_completion(FinishReason.ABORT, self.weight_version) for rid in wanted]

    def has_unfinished(self) -> bool:
        return bool(self.in_flight)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load Hugging Face-named weights as `version`; refused while requests are in flight. The prefix cache
        is emptied after, so no key or value computed by the old weights is reused."""
        if self.in_flight:
            raise RuntimeError(f"load_weights(version={version}) refused: {len(self.in_flight)} requests in flight "
                               "would mix weight versions; finish or abort them first")
        if self.is_sleeping and not self.has_weights:
            self.llm.wake_up(["weights"])
        unloaded = self.llm.apply_model(functools.partial(load_hf_weights, list(state_dict.items())))
        missing = sorted({name for names in unloaded for name in names})
        if missing:
            raise KeyError(f"load_weights(version={version}): these vLLM parameters got no weight: {missing}")
        self.llm.reset_prefix_cache()
        self.has_weights = True
        self.weight_version = version

    def sleep(self) -> None:
        """Free this engine's GPU memory for the trainer (colocated mode): vLLM's level-2 sleep discards weights
        and KV cache; the next `load_weights` brings weights back, `wake_up` the KV cache."""
        if self.in_flight:
            raise RuntimeError(f"sleep refused: {len(self.in_flight)} requests in flight")
        if not self.is_sleeping:
            self.llm.sleep(level=2)
            self.is_sleeping, self.has_weights = True, False

    def wake_up(self) -> None:
        """Back to serving after `sleep`; the weights must have been loaded since (level 2 discarded them)."""
        if not self.is_sleeping:
            return
        if not self.has_weights:
            raise RuntimeError("wake_up refused: the engine slept at level 2, which discarded its weights; "
                               "load_weights(...) first")
        if not self.llm.wake_up(["kv_cache"]):
            raise RuntimeError("vLLM's wake_up(['kv_cache']) left part of the engine's memory asleep")
        self.is_sleeping = False

    def _check_awake(self, what: str) -> None:
        if self.is_sleeping:
            raise RuntimeError(f"{what} refused: the engine is asleep (colocated offload); wake_up() first")

    def stats(self) -> EngineStats:
        num_running = sum(1 for seq in self.in_flight.values() if seq.num_generated)
        return EngineStats(num_slots=self.num_slots, num_running=num_running,
                           num_waiting=len(self.in_flight) - num_running, weight_version=self.weight_version,
                           steps=self.num_steps, busy_slot_steps=self.num_busy_slot_steps,
                           tokens_generated=self.num_tokens_generated)


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
