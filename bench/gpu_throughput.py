"""Our engine's useful tokens/s against transformers' `generate()` on the same model, device and lengths.

Both sides get the same prompts and the same forced response lengths (a
paper-like trace, EOS off): our engine stops each request at its length and
refills its slot; `generate()` runs the whole batch until the longest is
done, so its useful tokens are the same sum of lengths, while it computes
rows x longest. Both are greedy. Tokens/s counts useful tokens only.

On the H200 this ran past the 80 s its slot had without printing anything, so
it now takes a time budget and prints each part as it ends
(`compare_throughput`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from tailflow.engines.rollout import NativeEngine, Request, SamplingParams
from tailflow.engines.sim.lengths import seeded_rng
from tailflow.engines.sim.paper_lengths import PaperLikeLengths

ENGINE_SHARE = 0.3
"""Of a time budget, what the engine's run may take (it needs a fraction of generate()'s time)."""


@dataclass(frozen=True)
class Throughput:
    num_requests: int
    useful_tokens: int
    """The workload's useful tokens: the sum of the forced lengths."""
    engine_tokens: int
    engine_s: float
    generate_tokens: int
    """Useful tokens `generate()` produced: per row, up to its forced length."""
    generate_s: float
    engine_cut: bool = False
    """The engine's share of the time budget ran out first: its rate is over the tokens it made."""
    generate_cut: bool = False
    """`generate()` stopped at its `max_time`: its rate is over the first steps only, when every row was still
    useful, so it overstates the whole run's."""

    @property
    def engine_rate(self) -> float:
        return self.engine_tokens / self.engine_s if self.engine_s > 0 else 0.0

    @property
    def generate_rate(self) -> float:
        return self.generate_tokens / self.generate_s if self.generate_s > 0 else 0.0

    @property
    def speedup(self) -> float:
        return self.engine_rate / self.generate_rate if self.generate_rate > 0 else float("inf")

    def describe(self) -> str:
        cut = lambda flag: " (cut by the time budget)" if flag else ""  # noqa: E731
        return (f"{self.num_requests} requests, {self.useful_tokens} useful tokens: native engine "
                f"{self.engine_rate:,.0f} tok/s ({self.engine_tokens} in {self.engine_s:.2f} s{cut(self.engine_cut)}), "
                f"generate() {self.generate_rate:,.0f} tok/s ({self.generate_tokens} in {self.generate_s:.2f} s"
                f"{cut(self.generate_cut)}): {self.speedup:.2f}x")


def workload(num_requests: int, prompt_len: int, max_new_tokens: int, vocab: int, seed: int):
    lengths = PaperLikeLengths(num_requests, max_new_tokens, seed=seed)
    rng = seeded_rng("throughput-prompts", seed)
    prompts = [tuple(rng.randrange(vocab) for _ in range(prompt_len)) for _ in range(num_requests)]
    forced = [lengths.draw_for(p, f"{p}#0", 0, max_new_tokens).num_tokens for p in lengths.problem_ids()]
    return prompts, forced


def compare_throughput(model, device: str, num_requests: int, prompt_len: int, max_new_tokens: int,
                       num_slots: int, synchronize, seed: int = 0, budget_s: float | None = None,
                       report=print) -> Throughput:
    """`model` must already be on `device` in the engine's dtype (the engine then leaves it there).

    `budget_s` bounds the two timed runs together (None: unbounded): the engine gets up to `ENGINE_SHARE` of
    it (it stops stepping and aborts what is left), `generate()` what remains (its `max_time`). `report`
    gets a line after each part, so a stage stopped from outside has printed what it measured."""
    prompts, forced = workload(num_requests, prompt_len, max_new_tokens, model.config.vocab_size, seed)
    engine = NativeEngine(model, num_slots, prompt_len + max_new_tokens, seed=seed, eos_token_ids=(), device=device)
    requests = [Request(f"r{i}", p, SamplingParams(temperature=0.0, max_new_tokens=n))
                for i, (p, n) in enumerate(zip(prompts, forced))]
    started = time.perf_counter()
    engine.generate(requests[:num_slots])  # warm-up: graph capture, allocator
    synchronize()
    report(f"engine warm-up ({min(num_slots, num_requests)} requests) {time.perf_counter() - started:.1f} s")
    deadline = None if budget_s is None else time.perf_counter() + ENGINE_SHARE * budget_s
    clock = time.perf_counter()
    tokens_before = engine.num_tokens_generated
    started = time.perf_counter()
    engine.submit([Request(f"t{i}", r.prompt_token_ids, r.params) for i, r in enumerate(requests)])
    while engine.has_unfinished() and (deadline is None or time.perf_counter() < deadline):
        engine.step()
    engine_cut = engine.has_unfinished()
    if engine_cut:
        engine.abort([f"t{i}" for i in range(num_requests)])
    synchronize()
    engine_s = time.perf_counter() - started
    engine_tokens = engine.num_tokens_generated - tokens_before
    assert engine_cut or engine_tokens == sum(forced), "an engine response missed its length"
    report(f"engine: {engine_tokens} tokens in {engine_s:.2f} s ({engine_tokens / max(engine_s, 1e-9):,.0f} tok/s)"
           + (" (cut by the time budget)" if engine_cut else ""))
    ids = torch.tensor(prompts, device=device)
    remaining = None if budget_s is None else max(1.0, budget_s - (time.perf_counter() - clock))
    with torch.inference_mode():
        model.generate(ids[:2], max_new_tokens=4, do_sample=False, pad_token_id=0)  # warm-up
        synchronize()
        started = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max(forced),
                             min_new_tokens=max(forced), do_sample=False, pad_token_id=0, max_time=remaining)
        synchronize()
        generate_s = time.perf_counter() - started
    made = out.shape[1] - prompt_len
    generate_cut = made < max(forced)
    generate_tokens = sum(min(n, made) for n in forced)
    report(f"generate(): {generate_tokens} useful tokens in {generate_s:.2f} s "
           f"({generate_tokens / max(generate_s, 1e-9):,.0f} tok/s)"
           + (" (cut by the time budget)" if generate_cut else ""))
    return Throughput(num_requests, sum(forced), engine_tokens, engine_s, generate_tokens, generate_s, engine_cut,
                      generate_cut)
