"""The native torch rollout engine: continuous batching over fixed KV slots, on CPU or CUDA.

`step()` is the whole loop: admit waiting requests into free slots and prefill
their prompts, decode one token for every running row in one batched forward,
sample, and release the rows that finished (their slots are free for the next
step's admissions). `generate()` is submit + step until idle.

Nothing depends on the clock: with the same seed and the same submissions,
an engine produces bit-for-bit the same completions (on one device).

Device and dtype: fp32 on CPU, bf16 on CUDA (`default_dtype`); the engine
moves the model there. Logprobs are always computed in fp32 from the logits.

Multi-turn prefix reuse: a request with `keep_slot` leaves its keys and values in its slot when it finishes
(`kept_slots.py`); a request that `continues` it prefills only the tokens its prompt appends to that conversation.
A kept slot is occupied (`EngineStats.num_kept`) until continued, released (`release_kept`), or given back, oldest
first, when waiting requests need the room or more than `max_kept_slots` would be kept. Keys and values computed by
other weights are never reused: `load_weights` gives every kept slot back, and the continuing request prefills its
whole prompt with the current weights, as it does whenever the slot is gone; `sleep()` gives them back too (the
cache is freed).

Sleep mode, for a GPU shared with a trainer rank (vLLM's level-1 sleep): `sleep()`, `wake_up()`; asleep,
the engine only takes new weights (into the host copy) and answers `stats()`.
"""
from __future__ import annotations

from pathlib import Path
from itertools import islice
from typing import Iterable, Mapping, Sequence as Seq

import torch
from transformers import PreTrainedModel

from tailflow.engines.models import load_model
from tailflow.engines.rollout.kept_slots import KeptSlot, KeptSlots
from tailflow.engines.rollout.model_runner import ModelRunner, place_model
from tailflow.engines.rollout.protocol import Completion, EngineStats, FinishReason, Request
from tailflow.engines.rollout.sampler import make_batch, sample
from tailflow.engines.rollout.scheduler import RowMove, Scheduler, prefill_chunks
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
    `max_kept_slots` (default: `num_slots`) bounds the finished slots kept for continuations.
    """

    def __init__(self, model: PreTrainedModel, num_slots: int, max_seq_len: int, seed: int = 0,
                 eos_token_ids: Iterable[int] | None = None, weight_version: int = 0,
                 device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                 cuda_graphs: bool = True, bucketed_decode: bool | None = None,
                 max_kept_slots: int | None = None) -> None:
        if num_slots < 1 or max_seq_len < 2:
            raise ValueError(f"need num_slots >= 1 and max_seq_len >= 2, got {num_slots}, {max_seq_len}")
        place_model(model, device, dtype or default_dtype(device))
        self.runner = ModelRunner(model, num_slots, max_seq_len, cuda_graphs=cuda_graphs,
                                  bucketed_decode=bucketed_decode)
        self.scheduler = Scheduler(num_slots)
        self.kept = KeptSlots(num_slots, num_slots if max_kept_slots is None else max_kept_slots)
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
        self.num_prefill_tokens = 0
        self.num_reused_prefix_tokens = 0

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
            self._check_continuation(request)
        for request in requests:
            self.scheduler.add(Sequence(request, self.num_arrived, self.seed))
            self.num_arrived += 1

    def _check_continuation(self, request: Request) -> None:
        """A request continuing a kept slot must extend that conversation: its prompt (and prefix) start with
        the kept request's prompt and response. Anything else is the caller's bug, refused before queueing."""
        slot = self.kept.get(request.continues)
        if slot is None:
            return
        context = (*request.prompt_token_ids, *(request.prefix.token_ids if request.prefix else ()))
        if context[:len(slot.context_token_ids)] != slot.context_token_ids:
            raise ValueError(f"request {request.request_id!r} continues {slot.request_id!r} but its prompt does not "
                             f"start with that request's prompt and response ({len(slot.context_token_ids)} tokens)")

    # ---- the loop ----------------------------------------------------------------------------

    def step(self) -> list[Completion]:
        """Admit + prefill, decode one token per running row, return what finished in this step."""
        self._check_awake("step")
        admitted = self._admit()
        if admitted:
            self._prefill(admitted)
        running = self.scheduler.running
        if not running:
            return []
        tokens, logprobs = self._decode(running)
        return self._postprocess(running, tokens, logprobs)

    def _admit(self) -> list[Sequence]:
        """The scheduler's admission, with kept slots: the requests about to be admitted first take the kept
        slots they continue (usable ones), then the oldest kept slots are given back until they all fit."""
        window = list(islice(self.scheduler.waiting, self.num_slots - len(self.scheduler.running)))
        for seq in window:
            self._take_kept(seq)
        while len(self.kept) and self.num_slots - len(self.scheduler.running) - len(self.kept) < len(window):
            self._drop_kept(self.kept.oldest())
        return self.scheduler.admit(self.num_slots - len(self.kept))

    def _take_kept(self, seq: Sequence) -> None:
        """Move the keys and values of the slot `seq` continues out of the kept block, into `seq.kept_kv`.
        A slot computed by other weights than the current ones is given back instead (prefilled again)."""
        slot = self.kept.get(seq.request.continues)
        if slot is None:
            return
        context = tuple(seq.context_token_ids)
        if slot.weight_version != self.weight_version or context[:len(slot.context_token_ids)] != slot.context_token_ids:
            self._drop_kept(slot.request_id)
            return
        _, row, moves = self.kept.remove(slot.request_id)
        seq.kept_kv = (slot.num_cached, *self.runner.cache.read_row(row, slot.num_cached))
        self._apply(moves)

    def _drop_kept(self, request_id: str) -> None:
        _, _, moves = self.kept.remove(request_id)
        self._apply(moves)

    def _prefill(self, admitted: list[Sequence]) -> None:
        """Cache every admitted context (prompt, and a continued request's prefix) but its last token (decode
        feeds that one).

        Rows come sorted by prompt length; similar lengths are prefilled together. Requests that took a kept
        slot come last: their kept keys and values go into their row, and only the tokens after them are
        prefilled (`ModelRunner.extend`).
        """
        fresh = [seq for seq in admitted if seq.kept_kv is None]
        contexts = [seq.context_token_ids for seq in fresh]
        lengths = [len(context) - 1 for context in contexts]
        first_row = len(self.scheduler.running) - len(admitted)
        for start, end in prefill_chunks(lengths):
            width = max(lengths[start:end])
            if width > 0:
                rows = [context[:n] + [0] * (width - n)
                        for context, n in zip(contexts[start:end], lengths[start:end])]
                self.runner.prefill(torch.tensor(rows), first_row=first_row + start)
        for seq, n in zip(fresh, lengths):
            seq.num_cached = n
        self.num_prefill_tokens += sum(lengths)
        for row, seq in enumerate(admitted[len(fresh):], start=first_row + len(fresh)):
            self._prefill_continued(seq, row)

    def _prefill_continued(self, seq: Sequence, row: int) -> None:
        num_reused, keys, values = seq.kept_kv
        seq.kept_kv = None
        self.runner.cache.write_row(row, keys, values)
        appended = seq.context_token_ids[num_reused:-1]
        if appended:
            self.runner.extend(torch.tensor(appended), row, num_reused)
        seq.num_cached = num_reused + len(appended)
        self.num_prefill_tokens += len(appended)
        self.num_reused_prefix_tokens += num_reused

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
        kept = [(seq, *self.runner.cache.read_row(self.scheduler.running.index(seq), seq.num_cached))
                for seq in done if seq.request.keep_slot and self.kept.max_kept > 0]
        self._release(done)
        for seq, keys, values in kept:
            self._keep(seq, keys, values)
        return finished

    def _keep(self, seq: Sequence, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Put a finished `keep_slot` request's keys and values into the kept block (its row was freed by the
        release, so the rows add up: running + kept never exceeds num_slots)."""
        if seq.request_id in self.kept:
            self._drop_kept(seq.request_id)
        if self.kept.is_full():
            self._drop_kept(self.kept.oldest())
        slot = KeptSlot(seq.request_id, tuple(seq.context_token_ids), seq.num_cached, self.weight_version)
        self.runner.cache.write_row(self.kept.add(slot), keys, values)

    def release_kept(self, request_ids: Seq[str]) -> None:
        """Give back the kept slots of these finished requests (the conversation is over); unknown ids ignored."""
        for request_id in dict.fromkeys(request_ids):
            if request_id in self.kept:
                self._drop_kept(request_id)

    def _release(self, seqs: list[Sequence]) -> None:
        self._apply(self.scheduler.release(seqs))

    def _apply(self, moves: list[RowMove]) -> None:
        for move in moves:
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

        Asleep, they load into the host copy (a colocated sync lands before the wake) and are fused at wake.
        Kept slots are given back: their keys and values came from the old weights, so a request continuing one
        prefills its whole prompt with the new weights (slower, never stale)."""
        refuse_in_flight(f"load_weights(version={version})", len(self.scheduler.running), len(self.scheduler.waiting),
                         "would mix weight versions")
        own = {name: tuple(tensor.shape) for name, tensor in self.runner.model.state_dict().items()}
        tied = getattr(self.runner.model.config, "tie_word_embeddings", False)
        check_weight_names(own, state_dict, tied, version)
        self.runner.model.load_state_dict(dict(state_dict), strict=False)
        self.kept.clear()  # computed by the old weights: never reused (a continuation prefills all again)
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
        self.kept.clear()  # their keys and values go with the cache; a continuation prefills again
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
            num_kept=len(self.kept),
            prefill_tokens=self.num_prefill_tokens,
            reused_prefix_tokens=self.num_reused_prefix_tokens,
        )
