"""Our engine's useful tokens/s against transformers' `generate()` on the same model, device and lengths.

Both sides get the same prompts and the same forced response lengths (a
paper-like trace, EOS off): our engine stops each request at its length and
refills its slot; `generate()` runs the whole batch until the longest is
done, so its useful tokens are the same sum of lengths, while it computes
rows x longest. Both are greedy. Tokens/s counts useful tokens only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from tailflow.engines.rollout import NativeEngine, Request, SamplingParams
from tailflow.engines.sim.lengths import seeded_rng
from tailflow.engines.sim.paper_lengths import PaperLikeLengths


@dataclass(frozen=True)
class Throughput:
    num_requests: int
    useful_tokens: int
    engine_s: float
    generate_s: float

    @property
    def speedup(self) -> float:
        return self.generate_s / self.engine_s

    def describe(self) -> str:
        return (f"{self.num_requests} requests, {self.useful_tokens} useful tokens: native engine "
                f"{self.useful_tokens / self.engine_s:,.0f} tok/s ({self.engine_s:.2f} s), generate() "
                f"{self.useful_tokens / self.generate_s:,.0f} tok/s ({self.generate_s:.2f} s): {self.speedup:.2f}x")


def workload(num_requests: int, prompt_len: int, max_new_tokens: int, vocab: int, seed: int):
    lengths = PaperLikeLengths(num_requests, max_new_tokens, seed=seed)
    rng = seeded_rng("throughput-prompts", seed)
    prompts = [tuple(rng.randrange(vocab) for _ in range(prompt_len)) for _ in range(num_requests)]
    forced = [lengths.draw_for(p, f"{p}#0", 0, max_new_tokens).num_tokens for p in lengths.problem_ids()]
    return prompts, forced


def compare_throughput(model, device: str, num_requests: int, prompt_len: int, max_new_tokens: int,
                       num_slots: int, synchronize, seed: int = 0) -> Throughput:
    """`model` must already be on `device` in the engine's dtype (the engine then leaves it there)."""
    prompts, forced = workload(num_requests, prompt_len, max_new_tokens, model.config.vocab_size, seed)
    engine = NativeEngine(model, num_slots, prompt_len + max_new_tokens, seed=seed, eos_token_ids=(), device=device)
    requests = [Request(f"r{i}", p, SamplingParams(temperature=0.0, max_new_tokens=n))
                for i, (p, n) in enumerate(zip(prompts, forced))]
    engine.generate(requests[:num_slots])  # warm-up: graph capture, allocator
    synchronize()
    started = time.perf_counter()
    completions = engine.generate([Request(f"t{i}", r.prompt_token_ids, r.params) for i, r in enumerate(requests)])
    engine_s = time.perf_counter() - started
    assert sorted(len(c.token_ids) for c in completions) == sorted(forced), "an engine response missed its length"
    ids = torch.tensor(prompts, device=device)
    with torch.inference_mode():
        model.generate(ids[:2], max_new_tokens=4, do_sample=False, pad_token_id=0)  # warm-up
        synchronize()
        started = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max(forced),
                             min_new_tokens=max(forced), do_sample=False, pad_token_id=0)
        synchronize()
        generate_s = time.perf_counter() - started
    assert out.shape[1] == prompt_len + max(forced), "generate() stopped before the longest length"
    return Throughput(num_requests, sum(forced), engine_s, generate_s)
