"""What the tail-batching benchmarks share: the workload rule, the length profile, the engine curve.

The workload follows the paper's characterisation, not the targets: RollPacker
(arXiv 2509.21009) reports RLVR rollouts whose longest response is 25-32x the
median. The embedded task is built to that profile (a power law over 2-56
terms: reference solutions median 27 tokens, longest ~690, 26x), and the
default `rollout.max_new_tokens` (720) lets its longest solution finish, so the
tail the benchmarks see is the task's and the model's own, never cut short or
stretched. The benchmarks measure and print the ratio the policy's sampled
responses reach, against the floor of 20 the issue sets.
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
DEFAULT_CONFIG = REPO_DIR / "configs" / "default.yaml"
WARMSTART = REPO_DIR / "tailflow" / "assets" / "warmstart"

MAX_NEW_TOKENS = int(yaml.safe_load(DEFAULT_CONFIG.read_text())["rollout"]["max_new_tokens"])
"""The default config's response cap: the benchmarks run the workload users get."""
TAIL_RATIO_FLOOR = 20
"""The workload must reach longest/median >= 20 (the paper: 25-32)."""
CURVE_SIZES = (1, 4, 16, 64, 256)
CURVE_NEW_TOKENS = 64
ROLLOUT_THREADS = 2
"""torch threads of the rollout engine, as `cluster.rollout_threads` gives the rollout actor."""

if str(BENCH_DIR) not in sys.path:  # bench/ is not a package: engine.py is imported as a sibling
    sys.path.insert(0, str(BENCH_DIR))


SYNCHRONOUS = {"rollout.async_ratio": 0, "train.loss": "ppo_clip", "tail.continue_deferred": False}
"""The default config trains asynchronously and continues deferred prompts (the quick start's choices,
bench/async.py, bench/tail_batching.py's continuing run); the benchmarks of the synchronous step (tail batching
against its baseline, the sensitivity grid, the simulator's CPU checks) pin it back to what they have always
measured (ppo_clip, which continued tokens from older weights would need replaced)."""


def default_config_tree(overrides: dict[str, Any], synchronous: bool = True) -> dict[str, Any]:
    """configs/default.yaml as a dict, with dotted-key overrides applied (values as Python objects); with
    `synchronous`, SYNCHRONOUS first."""
    return config_tree(DEFAULT_CONFIG, {**SYNCHRONOUS, **overrides} if synchronous else overrides)


def config_tree(path: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """The YAML config at `path` as a dict, with dotted-key overrides applied (values as Python objects)."""
    tree = yaml.safe_load(path.read_text())
    for dotted, value in overrides.items():
        *sections, key = dotted.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
    return tree


def chosen_names(parser, listed: str, known, what: str) -> list[str]:
    """A comma-separated choice of `known` names from the command line; anything else is the parser's error."""
    names = listed.split(",")
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"unknown {what} {unknown}; known: {', '.join(known)}")
    return names


def percentile(values: Sequence[float], q: float) -> float:
    from engine import percentile as engine_percentile

    return engine_percentile(list(values), q)


@dataclass(frozen=True)
class LengthProfile:
    """Response lengths (tokens) of one sampled rollout."""

    num_responses: int
    median: float
    p75: float
    p99: float
    longest: int
    num_truncated: int
    """Responses that reached max_new_tokens."""

    @classmethod
    def of(cls, lengths: Sequence[int], max_new_tokens: int) -> "LengthProfile":
        return cls(len(lengths), statistics.median(lengths), percentile(lengths, 0.75), percentile(lengths, 0.99),
                   max(lengths), sum(1 for n in lengths if n >= max_new_tokens))

    @property
    def tail_ratio(self) -> float:
        """Longest / median: the paper's 25-32x."""
        return self.longest / self.median

    def describe(self) -> str:
        return (f"{self.num_responses} responses: median {self.median:.0f}, P75 {self.p75:.0f}, P99 {self.p99:.0f}, "
                f"max {self.longest} tokens; max/median {self.tail_ratio:.1f}x; "
                f"{self.num_truncated} ({self.num_truncated / self.num_responses:.1%}) truncated")


def sample_lengths(num_prompts: int, responses_per_prompt: int, max_new_tokens: int, seed: int,
                   num_threads: int = ROLLOUT_THREADS) -> list[int]:
    """Sample the warm-start model at temperature 1 on the first train prompts; their response lengths.

    An in-process engine, independent of any training run: the default task's
    own length distribution at this cap.
    """
    from transformers import AutoTokenizer

    from tailflow.engines.data.arith import default_splits
    from tailflow.engines.rollout import RolloutWorker, SamplingParams
    from tailflow.engines.rollout.requests import sampling_requests

    problems, _ = default_splits(num_prompts, 1, seed)
    tokenizer = AutoTokenizer.from_pretrained(WARMSTART)
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens)
    requests = sampling_requests(problems, responses_per_prompt, params, tokenizer, seed, iteration=0)
    longest_prompt = max(len(r.prompt_token_ids) for r in requests)
    worker = RolloutWorker(str(WARMSTART), 128, longest_prompt + max_new_tokens, seed, num_threads)
    return [len(completion.token_ids) for completion in worker.generate(requests)]


@dataclass(frozen=True)
class CurvePoint:
    active: int
    tokens_per_s: float

    @property
    def ms_per_step(self) -> float:
        """One decode step of `active` rows (each row makes one token a step)."""
        return 1000 * self.active / self.tokens_per_s


def engine_curve(sizes: Sequence[int] = CURVE_SIZES, new_tokens: int = CURVE_NEW_TOKENS, seed: int = 0,
                 num_threads: int = ROLLOUT_THREADS) -> list[CurvePoint]:
    """bench/engine.py's throughput curve: tokens/s with `size` requests all active."""
    import torch
    from engine import build_workload, throughput_curve

    threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        points = throughput_curve(build_workload(max(sizes), seed), list(sizes), new_tokens, seed)
    finally:
        torch.set_num_threads(threads)
    return [CurvePoint(size, tokens_per_s) for size, tokens_per_s in points]


def describe_curve(points: Sequence[CurvePoint], new_tokens: int, num_threads: int = ROLLOUT_THREADS) -> str:
    lines = [f"engine throughput curve (bench/engine.py; {new_tokens} new tokens per request, all active, "
             f"{num_threads} torch threads):"]
    lines += [f"  {p.active:4d} active: {p.tokens_per_s:8.0f} tokens/s  {p.ms_per_step:7.2f} ms per decode step"
              for p in points]
    return "\n".join(lines)


def step_cost_growth(points: Sequence[CurvePoint], small: int = 16) -> tuple[CurvePoint, CurvePoint]:
    """The point at `small` active rows (or the nearest below) and the largest one: how a step's cost grows."""
    below = [p for p in points if p.active <= small] or list(points)
    return below[-1], points[-1]


def fmt_ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.2f}x" if denominator else "n/a"
