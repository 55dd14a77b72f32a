"""The native torch rollout engine: continuous batching over fixed KV slots, on CPU or CUDA.

`step()` is the whole loop: admit waiting requests into free slots and prefill
their prompts, decode one token for every running row in one batched forward,
sample, and release the rows that finished (their slots are free for the next
step's admissions). `generate()` is submit + step until idle.

Nothing depends on the clock: with the same seed and the same submissions,
an engine produces bit-for-bit the same completions (on one device).

Device and dtype: fp32 on CPU, bf16 on CUDA (`default_dtype`); the engine
moves the model there. Logprobs are always computed in fp32 from the logits.

Sleep mode, for a GPU shared with a trainer rank (vLLM's level-1 sleep): `sleep()`, `wake_up()`; asleep,
the engine only takes new weights (into the host copy) and answers `stats()`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping, Sequence as Seq

import torch
from transformers import PreTrainedModel

from tailflow.engines.models import load_model
from tailflow.engines.rollout.model_runner import ModelRunner, place_model
from tailflow.engines.rollout.protocol import Completion, EngineStats, FinishReason, Request
from tailflow.engines.rollout.sampler import make_batch, sample
from tailflow.engines.rollout.scheduler import Scheduler, prefill_chunks
from tailflow.engines.rollout.sequence import Sequence, check_requests, eos_ids, refuse_in_flight
from tailflow.engines.rollout.vllm_weights import check_weight_names


def default_dtype(device: torch.device | str) -> torch.dtype:
    """bf16 on CUDA (what GPU rollout engines run), fp32 on CPU (CPU bf16 matmuls are slow and inexact)."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


class NativeEngine:
    """A `RolloutEngine` for qwen2/qwen3/llama models on CPU or CUDA.

    `num_slots` rows decode together; each holds at most `max_seq_len` tokens
    (prompt + response). `eos_token_ids=None` reads them from the model's
    config; `()` disables EOS (used by benchmarks that force lengths).
    `device`/`dtype` place the model (moved in place); `cuda_graphs` captures
    the decode step on CUDA (ignored on CPU, whose decode stays eager); `bucketed_decode` (default: on
    CUDA only) pads decode to the graphs' bucket shapes, which on CPU runs them eagerly (for tests).
    """

    def __init__(self, model: PreTrainedModel, num_slots: int, max_seq_len: int, seed: int = 0,
                 eos_token_ids: Iterable[int] | None = None, weight_version: int = 0,
                 device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                 cuda_graphs: bool = True, bucketed_decode: bool | None = None) -> None:
        if num_slots < 1 or max_seq_len < 2:
            raise ValueError(f"need num_slots >= 1 and max_seq_len >= 2, got {num_slots}, {max_seq_len}")
        place_model(model, device, dtype or default_dtype(device))
        self.runner = ModelRunner(model, num_slots, max_seq_len, cuda_graphs=cuda_graphs,
                                  bucketed_decode=bucketed_decode)
        self.scheduler = Scheduler(num_slots)
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.seed = seed
        self.vocab_size = model.config.vocab_size
        config_eos = eos_ids(getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                             model.config.eos_token_id)
        self.eos_token_ids = frozenset(config_eos if eos_token_ids is None else eos_token_ids)
        self.weight_version = weight_version
        self.num_arrived = 0
        self.num_steps = 0
        self.num_busy_slot_steps = 0
        self.num_tokens_generated = 0

    @classmethod
    def from_pretrained(cls, path: str | Path, num_slots: int, max_seq_len: int, seed: int = 0,
                        eos_token_ids: Iterable[int] | None = None, weight_version: int = 0,
                        device: torch.device | str = "cpu") -> "NativeEngine":
        """Load a Hugging Face directory; `load_model` refuses other architectures, naming the type."""
        return cls(load_model(path), num_slots, max_seq_len, seed, eos_token_ids, weight_version, device=device)

    # ---- requests in -------------------------------------------------------------------------

    def submit(self, requests: Seq[Request]) -> None:
        """Queue requests FIFO; all are validated before any is queued."""
        self._check_awake("submit")
        check_requests(requests, self.scheduler.in_flight_ids(), self.vocab_size, self.max_seq_len)
        for request in requests:
            self.scheduler.add(Sequence(request, self.num_arrived, self.seed))
            self.num_arrived += 1

    # ---- the loop ----------------------------------------------------------------------------

    def step(self) -> list[Completion]:
        """Admit + prefill, decode one token per running row, return what finished in this step."""
        self._check_awake("step")
        admitted = self.scheduler.admit()
        if admitted:
            self._prefill(admitted)
        running = self.scheduler.running
        if not running:
            return []
        tokens, logprobs = self._decode(running)
        return self._postprocess(running, tokens, logprobs)

    def _prefill(self, admitted: list[Sequence]) -> None:
        """Cache every admitted context (prompt, and a continued request's prefix) but its last token (decode
        feeds that one).

        Rows come sorted by prompt length; similar lengths are prefilled together.
        """
        contexts = [seq.context_token_ids for seq in admitted]
        lengths = [len(context) - 1 for context in contexts]
        first_row = len(self.scheduler.running) - len(admitted)
        for start, end in prefill_chunks(lengths):
            width = max(lengths[start:end])
            if width > 0:
                rows = [context[:n] + [0] * (width - n)
                        for context, n in zip(contexts[start:end], lengths[start:end])]
                self.runner.prefill(torch.tensor(rows), first_row=first_row + start)
        for seq, n in zip(admitted, lengths):
            seq.num_cached = n

    def _decode(self, running: list[Sequence]) -> tuple[list[int], list[float]]:
        positions = [seq.num_cached for seq in running]
        token_ids = torch.tensor([seq.last_token_id for seq in running])
        logits = self.runner.decode(token_ids, torch.tensor(positions), max(positions) + 1)
        params = [seq.params for seq in running]
        batch = make_batch([p.temperature for p in params], [p.top_k for p in params],
                           [p.top_p for p in params], [seq.generator for seq in running], logits.device)
        tokens, logprobs = sample(logits, batch)
        self.num_steps += 1
        self.num_busy_slot_steps += len(running)
        self.num_tokens_generated += len(running)
        return tokens.tolist(), logprobs.tolist()

    def _postprocess(self, running: list[Sequence], tokens: list[int], logprobs: list[float]) -> list[Completion]:
        finished, done = [], []
        for seq, token, logprob in zip(running, tokens, logprobs):
            seq.append(token, logprob, self.weight_version)
            reason = seq.finish_reason(self.eos_token_ids)
            if reason is not None:
                finished.append(seq.to_completion(reason, self.weight_version))
                done.append(seq)
        self._release(done)
        return finished

    def _release(self, seqs: list[Sequence]) -> None:
        for move in self.scheduler.release(seqs):
            self.runner.cache.move(move.src_row, move.dst_row, move.length)

    def generate(self, requests: Seq[Request]) -> list[Completion]:
        """Submit and step until idle; every completion finished meanwhile, in finish order."""
        self._check_awake("generate")
        self.submit(requests)
        completions = []
        while self.has_unfinished():
            completions.extend(self.step())
        return completions

    def in_flight(self) -> list[Sequence]:
        """Every request not finished, running first: its response so far (what a group moves elsewhere)."""
        return [*self.scheduler.running, *self.scheduler.waiting]

    @torch.no_grad()
    def next_token_logprobs(self, prompt_token_ids: Seq[int], candidate_ids: Seq[int]) -> list[float]:
        """Log-probabilities of `candidate_ids` as the token after the prompt (temperature 1).

        A prefill-only query, the judge's whole use of an engine (vLLM answers the same question with
        `SamplingParams(max_tokens=1, logprobs=k)`). It runs outside the slot cache, so it may interleave
        with generation.
        """
        self._check_awake("next_token_logprobs")
        if not prompt_token_ids:
            raise ValueError("next_token_logprobs: empty prompt")
        if len(prompt_token_ids) > self.max_seq_len:
            raise ValueError(f"next_token_logprobs: prompt of {len(prompt_token_ids)} tokens exceeds the engine's "
                             f"max_seq_len {self.max_seq_len}")
        bad = [t for t in candidate_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"next_token_logprobs: candidate ids {bad} are outside the vocabulary [0, {self.vocab_size})")
        ids = torch.tensor([list(prompt_token_ids)], device=self.runner.device)
        logits = self.runner.model(ids).logits[0, -1].float()
        return torch.log_softmax(logits, dim=-1)[list(candidate_ids)].tolist()

    # ---- control -----------------------------------------------------------------------------

    def abort(self, request_ids: Seq[str]) -> list[Completion]:
        """Stop these requests now; running ones free their slots at once.

        Returns partial completions (ABORT) in the order of `request_ids`; ids
        not in flight (already finished, unknown) are ignored.
        """
        wanted = set(request_ids)
        stopped = {seq.request_id: seq for seq in self.scheduler.remove_waiting(wanted)}
        running = [seq for seq in self.scheduler.running if seq.request_id in wanted]
        self._release(running)
        stopped.update((seq.request_id, seq) for seq in running)
        return [stopped[rid].to_completion(FinishReason.ABORT, self.weight_version)
                for rid in dict.fromkeys(request_ids) if rid in stopped]

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Replace all weights (a tied lm_head may be absent); refused while requests are in flight.

        Asleep, they load into the host copy (a colocated sync lands before the wake) and are fused at wake."""
        refuse_in_flight(f"load_weights(version={version})", len(self.scheduler.running), len(self.scheduler.waiting),
                         "would mix weight versions")
        own = {name: tuple(tensor.shape) for name, tensor in self.runner.model.state_dict().items()}
        tied = getattr(self.runner.model.config, "tie_word_embeddings", False)
        check_weight_names(own, state_dict, tied, version)
        self.runner.model.load_state_dict(dict(state_dict), strict=False)
        if not self.is_asleep:
            self.runner.refresh_weights()
        self.weight_version = version

    @property
    def is_asleep(self) -> bool:
        return self.runner.is_released

    def sleep(self) -> None:
        """Give the device memory to a colocated trainer: KV cache, fused weights, rope tables and decode graphs
        are freed, the weights wait in host memory. Refused with requests in flight (their keys and values
        live in the cache). Idempotent."""
        refuse_in_flight("sleep", len(self.scheduler.running), len(self.scheduler.waiting), "are in flight")
        self.runner.release_memory()

    def wake_up(self) -> None:
        """Back on the device after `sleep()`, with whatever weights were loaded meanwhile; a seeded request
        then gives exactly what it would have without the sleep on CPU and on eager CUDA. The CUDA graphs are
        captured again, and on an H200 that changed one greedy token in 16 x 64 (docs/gpu.md). Idempotent."""
        self.runner.restore_memory()

    def _check_awake(self, what: str) -> None:
        if self.is_asleep:
            raise RuntimeError(f"{what} refused: engine is asleep: call wake_up() first")

    def stats(self) -> EngineStats:
        return EngineStats(
            num_slots=self.num_slots,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            weight_version=self.weight_version,
            steps=self.num_steps,
            busy_slot_steps=self.num_busy_slot_steps,
            tokens_generated=self.num_tokens_generated,
        )
