"""Native engine vs transformers on the embedded task: useful tokens per second.

    python bench/engine.py [--requests 64] [--quick] [--threads 1]

Rollout lengths on the default task are long-tailed, so a static batch
(`model.generate()`) keeps computing rows that have finished until its longest
row ends; the native engine frees a finished row's slot at once. Only useful
tokens count: each request's tokens up to its own finish.

Lengths: with the shipped warm-start checkpoint (tailflow/assets/warmstart/)
every method samples (temperature 1) until EOS, the task's real lengths. With
no checkpoint, a random-init model is used and each request's length is forced
to its reference solution's length (+1 for EOS): max_new_tokens = that length,
EOS disabled, so no method can stop early and the lengths follow the task's
distribution exactly. The last line is `RESULT engine_speedup_vs_generate=<x>`.
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedModel

from tailflow.engines.data.arith import default_splits
from tailflow.engines.data.tokenizer import build_char_tokenizer
from tailflow.engines.models import build_tiny_model, load_model
from tailflow.engines.rollout import NativeEngine, Request, SamplingParams

WARMSTART = Path(__file__).resolve().parents[1] / "tailflow" / "assets" / "warmstart"
WARMSTART_MAX_NEW_TOKENS = 300
CURVE_NEW_TOKENS = 64


@dataclass(frozen=True)
class Workload:
    """What every method is asked to do; `max_new_tokens[i]` is request i's own cap."""

    model: PreTrainedModel
    prompts: list[list[int]]
    max_new_tokens: list[int]
    use_eos: bool
    eos_token_id: int
    pad_token_id: int
    description: str


@dataclass(frozen=True)
class Timing:
    name: str
    seconds: float
    useful_tokens: int
    lengths: list[int]

    @property
    def tokens_per_s(self) -> float:
        return self.useful_tokens / self.seconds


def build_workload(num_requests: int, seed: int) -> Workload:
    tokenizer = build_char_tokenizer()
    problems, _ = default_splits(num_requests, 1, seed)
    prompts = [tokenizer(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if (WARMSTART / "config.json").is_file():
        return Workload(load_model(WARMSTART), prompts, [WARMSTART_MAX_NEW_TOKENS] * num_requests, True, eos, pad,
                        f"warm-start checkpoint {WARMSTART}: sampled at temperature 1 until EOS "
                        f"(cap {WARMSTART_MAX_NEW_TOKENS})")
    lengths = [len(tokenizer(p.solution, add_special_tokens=False)["input_ids"]) + 1 for p in problems]
    model = build_tiny_model(len(tokenizer), eos, pad, seed=seed)
    # generate() fills unset (None) fields from the model's own generation config: unset EOS there too.
    model.generation_config.eos_token_id = None
    return Workload(model, prompts, lengths, False, eos, pad,
                    "no warm-start checkpoint: random-init tiny Qwen2, each request forced to its reference "
                    "solution's length + 1 (max_new_tokens = that, EOS disabled, so nothing stops early)")


def engine_requests(workload: Workload, seed: int) -> list[Request]:
    return [Request(f"r{i}", tuple(prompt), SamplingParams(temperature=1.0, max_new_tokens=n, seed=seed + i))
            for i, (prompt, n) in enumerate(zip(workload.prompts, workload.max_new_tokens))]


def make_engine(workload: Workload, num_slots: int, max_new_tokens: int, seed: int) -> NativeEngine:
    max_seq_len = max(len(p) for p in workload.prompts) + max_new_tokens
    eos = None if workload.use_eos else ()
    return NativeEngine(workload.model, num_slots, max_seq_len, seed=seed, eos_token_ids=eos)


def time_native(workload: Workload, num_slots: int, seed: int) -> Timing:
    engine = make_engine(workload, num_slots, max(workload.max_new_tokens), seed)
    engine.generate(engine_requests(workload, seed)[:2])  # warm-up
    start = time.perf_counter()
    completions = engine.generate(engine_requests(workload, seed))
    seconds = time.perf_counter() - start
    lengths = [len(c.token_ids) for c in completions]
    return Timing("native engine", seconds, sum(lengths), lengths)


def generation_config(workload: Workload, max_new_tokens: int) -> GenerationConfig:
    return GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
        eos_token_id=workload.eos_token_id if workload.use_eos else None, pad_token_id=workload.pad_token_id,
    )


def useful_length(tokens: list[int], cap: int, workload: Workload) -> int:
    """Tokens up to this request's own finish: its cap, or its first EOS (kept)."""
    tokens = tokens[:cap]
    if workload.use_eos and workload.eos_token_id in tokens:
        return tokens.index(workload.eos_token_id) + 1
    return len(tokens)


def time_generate(workload: Workload, seed: int) -> Timing:
    """One left-padded batch of every prompt, run until the longest cap (or every row's EOS)."""
    width = max(len(p) for p in workload.prompts)
    input_ids = torch.tensor([[workload.pad_token_id] * (width - len(p)) + p for p in workload.prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in workload.prompts])
    config = generation_config(workload, max(workload.max_new_tokens))
    with torch.inference_mode():
        workload.model.generate(input_ids=input_ids[:2], attention_mask=attention_mask[:2],
                                generation_config=generation_config(workload, 4))  # warm-up
        torch.manual_seed(seed)
        start = time.perf_counter()
        output = workload.model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
        seconds = time.perf_counter() - start
    responses = output[:, width:].tolist()
    lengths = [useful_length(r, cap, workload) for r, cap in zip(responses, workload.max_new_tokens)]
    return Timing("transformers generate()", seconds, sum(lengths), lengths)


def time_generate_batch(workload: Workload, seed: int) -> Timing:
    """transformers' continuous batching; it has one max_new_tokens for all, so with forced
    lengths every request runs to the longest cap and only each one's own length counts."""
    config = generation_config(workload, max(workload.max_new_tokens))
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.inference_mode():
        results = workload.model.generate_batch(inputs=workload.prompts, generation_config=config, warmup=False)
    seconds = time.perf_counter() - start
    outputs = list(results.values())
    if len(outputs) != len(workload.prompts) or any(o.error for o in outputs):
        raise RuntimeError(f"generate_batch returned {len(outputs)} of {len(workload.prompts)} results")
    lengths = [useful_length(o.generated_tokens, cap, workload) for o, cap in zip(outputs, workload.max_new_tokens)]
    return Timing("transformers generate_batch()", seconds, sum(lengths), lengths)


def throughput_curve(workload: Workload, sizes: list[int], new_tokens: int, seed: int) -> list[tuple[int, float]]:
    """Engine tokens/s with `size` requests all active, each exactly `new_tokens` long (EOS off)."""
    prompts = (workload.prompts * (max(sizes) // len(workload.prompts) + 1))[: max(sizes)]
    fixed = Workload(workload.model, prompts, [new_tokens] * len(prompts), False,
                     workload.eos_token_id, workload.pad_token_id, "curve")
    points = []
    for size in sizes:
        sized = Workload(fixed.model, prompts[:size], fixed.max_new_tokens[:size], False,
                         fixed.eos_token_id, fixed.pad_token_id, "curve")
        timing = time_native(sized, size, seed)
        points.append((size, timing.tokens_per_s))
    return points


def percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report_lengths(lengths: list[int]) -> str:
    return (f"median {statistics.median(lengths):.0f}, P75 {percentile(lengths, 0.75)}, "
            f"P99 {percentile(lengths, 0.99)}, max {max(lengths)}, total {sum(lengths)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64, help="requests in the side-by-side comparison")
    parser.add_argument("--quick", action="store_true", help="smoke run: 8 requests, short curve, no generate_batch")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads; 1 is how a rollout worker runs (one engine per core), "
                             "and more threads than free cores makes every method several times slower")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    num_requests = 8 if args.quick else args.requests
    workload = build_workload(num_requests, args.seed)
    print(f"workload: {num_requests} requests of the default task; {workload.description}")
    print(f"threads: {args.threads}; native num_slots={num_requests}")

    native = time_native(workload, num_requests, args.seed)
    generate = time_generate(workload, args.seed)
    timings = [native, generate]
    if not args.quick:
        try:
            timings.append(time_generate_batch(workload, args.seed))
        except Exception as error:  # report and carry on: it is only a reference point
            print(f"transformers generate_batch() failed: {type(error).__name__}: {error}")

    print(f"useful lengths (native): {report_lengths(native.lengths)}")
    print(f"useful lengths (generate): {report_lengths(generate.lengths)}")
    for timing in timings:
        print(f"{timing.name:32s} {timing.seconds:8.2f} s  {timing.useful_tokens:7d} useful tokens  "
              f"{timing.tokens_per_s:9.0f} tokens/s  ({timing.tokens_per_s / generate.tokens_per_s:.2f}x generate)")

    sizes, new_tokens = ([1, 4, 16], 16) if args.quick else ([1, 4, 16, 64, 256], CURVE_NEW_TOKENS)
    print(f"engine throughput curve ({new_tokens} new tokens per request, all active):")
    for size, tokens_per_s in throughput_curve(workload, sizes, new_tokens, args.seed):
        print(f"  {size:4d} active: {tokens_per_s:9.0f} tokens/s")
    print(f"RESULT engine_speedup_vs_generate={native.tokens_per_s / generate.tokens_per_s:.2f}")


if __name__ == "__main__":
    main()
