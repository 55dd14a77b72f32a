"""The `rope` stage: the native engine's rotary tables and logits against Hugging Face's at long positions.

The bug this is evidence for (fixed 2026-11-27, after the H200 run, and never
re-run on a GPU): the engine cast the whole model to bf16, rounding the rotary
module's `inv_freq`, which Hugging Face keeps in fp32; every angle was then off
by its position times bf16's error, up to whole radians at 32k. `place_model`
now casts only parameters.

What is measured, on one engine (bf16 on CUDA) with rows at several prompt
lengths up to `max_position`:

* the tables: the engine's cos/sin against Hugging Face's own (its rotary
  module, fp32 `inv_freq`, rounded to bf16 as it applies them), and how far
  the pre-fix table (`inv_freq` rounded first) is from them;
* the logits: a greedy decode of `new_tokens` tokens per row, teacher-forced
  traces (`gpu_trace.py`) with the engine's table and with the pre-fix table
  (the control: a check that cannot tell those apart proves nothing), each
  against an fp32 forward of Hugging Face's model over the same bf16 weights
  at the same positions; Hugging Face's own bf16 forward against that fp32
  reference gives the noise floor two correct bf16 programs show. Errors are
  max |logit difference| over a row's steps divided by the reference logits'
  RMS (so they do not depend on how large random logits happen to be). The
  engine passes when its error is within `FLOOR_FACTOR` times that floor plus
  `FLOOR_SLACK`; the control counts as seen when it is worse than that bound
  on the engine's own error;
* the tokens: Hugging Face's greedy `generate()` (bf16) from the same
  prompts: how many of the engine's greedy tokens it repeats before the first
  difference (bf16 near-ties can flip a token in any two programs: reported,
  not judged).

Random weights from `build_model` attend almost uniformly (attention scores
of std ~0.4 on the 0.5B shape, less on the tiny one), so a wrong rotation
would barely change the logits: q and k are scaled so the scores' standard
deviation is about `SCORE_STD`, and attention then depends on the positions
(without it the dry run's control went unseen).
"""
from __future__ import annotations

import copy
import random
from dataclasses import asdict, dataclass

import torch

from gpu_trace import forced_decode

SCORE_STD = 4.0
FLOOR_FACTOR = 2.0
FLOOR_SLACK = 0.01


@dataclass(frozen=True)
class RopeRow:
    prompt_len: int
    engine_error: float
    """max |engine logits - fp32 reference| over this row's decode steps, / the reference's RMS."""
    hf_bf16_error: float
    """The same for Hugging Face's bf16 forward: the noise floor."""
    prefix_error: float
    """The same for the engine with the pre-fix table (teacher-forced on the engine's tokens)."""
    tokens_equal_to_hf_generate: int
    """Leading greedy tokens equal to Hugging Face's bf16 `generate()`, of `new_tokens`."""
    new_tokens: int

    @property
    def within_floor(self) -> bool:
        return self.engine_error <= FLOOR_FACTOR * self.hf_bf16_error + FLOOR_SLACK

    @property
    def control_detected(self) -> bool:
        """The pre-fix table is visibly worse than the engine's (the check has teeth at this length)."""
        return self.prefix_error > FLOOR_FACTOR * self.engine_error + FLOOR_SLACK


@dataclass(frozen=True)
class RopeResult:
    device: str
    dtype: str
    max_position: int
    cos_max_abs_diff: float
    sin_max_abs_diff: float
    tables_equal: bool
    """The engine's cos and sin tables equal Hugging Face's, bit for bit."""
    prefix_table_max_abs_diff: float
    """max |pre-fix cos/sin - Hugging Face's|: what the fix removed."""
    rows: list[RopeRow]

    @property
    def passed(self) -> bool:
        return self.tables_equal and all(row.within_floor for row in self.rows)

    def to_json(self) -> dict:
        rows = [{**asdict(row), "within_floor": row.within_floor, "control_detected": row.control_detected}
                for row in self.rows]
        return {**asdict(self), "rows": rows, "passed": self.passed}

    def describe(self) -> list[str]:
        lines = [f"tables to position {self.max_position}: equal to Hugging Face's {self.tables_equal} "
                 f"(max |diff| cos {self.cos_max_abs_diff:.3g}, sin {self.sin_max_abs_diff:.3g}); "
                 f"the pre-fix table was {self.prefix_table_max_abs_diff:.3g} off",
                 f"{'prompt':>7} {'engine err':>11} {'HF bf16 err':>12} {'pre-fix err':>12} {'= HF greedy':>12}"
                 f" {'within floor':>13} {'control seen':>13}"]
        for row in self.rows:
            lines.append(f"{row.prompt_len:7d} {row.engine_error:11.4f} {row.hf_bf16_error:12.4f} "
                         f"{row.prefix_error:12.4f} {row.tokens_equal_to_hf_generate:>6d}/{row.new_tokens:<5d}"
                         f" {str(row.within_floor):>13} {str(row.control_detected):>13}")
        lines.append(f"RESULT rope_passed={self.passed}")
        return lines


def sharpen_attention(model, score_std: float) -> float:
    """Scale every layer's q and k projections (and biases) by one factor so that, for inputs of unit RMS (what
    the RMSNorm before them gives), q . k / sqrt(head_dim) has about `score_std` standard deviation: each of q's
    and k's entries then has std sqrt(score_std), i.e. w_std * sqrt(hidden) * factor. Returns the factor."""
    hidden = model.config.hidden_size
    w_std = torch.stack([layer.self_attn.q_proj.weight.detach().float().std()
                         for layer in model.model.layers]).mean().item()
    factor = score_std ** 0.5 / (w_std * hidden ** 0.5)
    with torch.no_grad():
        for layer in model.model.layers:
            for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                linear.weight.mul_(factor)
                if linear.bias is not None:
                    linear.bias.mul_(factor)
    return factor


def hf_tables(model, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's cos/sin at `positions` for activations of `dtype`, as its attention applies them."""
    with torch.inference_mode():
        cos, sin = model.model.rotary_emb(torch.zeros(1, dtype=dtype, device=positions.device), positions[None])
    return cos[0], sin[0]


def prefix_tables(model, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The table the engine had before the fix: `inv_freq` rounded to `dtype` first (the rotary module is
    restored afterwards)."""
    rotary = model.model.rotary_emb
    exact = rotary.inv_freq
    try:
        rotary.inv_freq = exact.to(dtype).to(exact.dtype)
        return hf_tables(model, positions, dtype)
    finally:
        rotary.inv_freq = exact


def rounded_reference(model, dtype: torch.dtype, device: str):
    """A copy of `model` whose parameters are rounded to `dtype` and computed in fp32 on `device`; its buffers
    (the rotary `inv_freq`) untouched: `model.to(bf16)` would round `inv_freq` too, the very bug measured."""
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.data = parameter.data.to(dtype).float()
    return reference.to(device).eval()


REFERENCE_CHUNK = 2048
"""Tokens per forward of the reference: an fp32 forward has no flash kernel, and SDPA's math path over 32k
positions in one forward materialises [heads, 32k, 32k] scores (about 60 GB each, twice: the H200 ran out at
121 GB). Chunks through a KV cache bound that to [heads, 2048, 32k]."""


def reference_logits(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """[len(tokens), vocab] logits predicting each of `tokens` after `prompt`: the sequence fed in chunks of
    `REFERENCE_CHUNK` through a KV cache, the logits of the last len(tokens) positions kept."""
    from transformers import DynamicCache

    sequence = prompt + tokens[:-1]
    device = next(model.parameters()).device
    first_kept = len(sequence) - len(tokens)
    cache = DynamicCache()
    kept = []
    with torch.inference_mode():
        for start in range(0, len(sequence), REFERENCE_CHUNK):
            chunk = sequence[start:start + REFERENCE_CHUNK]
            ids = torch.tensor([chunk], device=device)
            positions = torch.arange(start, start + len(chunk), device=device)
            keep = max(0, start + len(chunk) - first_kept)
            output = model(input_ids=ids, past_key_values=cache, use_cache=True, cache_position=positions,
                           logits_to_keep=min(keep, len(chunk)) if keep else 1)
            if keep:
                kept.append(output.logits[0, -min(keep, len(chunk)):].float())
    return torch.cat(kept)


def leading_equal(a: list[int], b: list[int]) -> int:
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


def measure_rope(model, device: str, prompt_lengths: tuple[int, ...], new_tokens: int, seed: int = 0) -> RopeResult:
    """`model`: a random fp32 model (any device): q and k are scaled here, an fp32 reference copied, and the
    engine then places it on `device` in bf16 (parameters only, as `place_model` does)."""
    from tailflow.engines.rollout import NativeEngine

    sharpen_attention(model, SCORE_STD)
    reference = rounded_reference(model, torch.bfloat16, device)
    max_position = max(prompt_lengths) + new_tokens
    engine = NativeEngine(model, num_slots=len(prompt_lengths), max_seq_len=max_position, eos_token_ids=(),
                          device=device, dtype=torch.bfloat16)
    runner = engine.runner

    positions = torch.arange(max_position, device=device)
    cos, sin = hf_tables(model, positions, torch.bfloat16)
    old_cos, old_sin = prefix_tables(model, positions, torch.bfloat16)
    table = dict(cos_max_abs_diff=(runner.cos.float() - cos.float()).abs().max().item(),
                 sin_max_abs_diff=(runner.sin.float() - sin.float()).abs().max().item(),
                 tables_equal=torch.equal(runner.cos, cos) and torch.equal(runner.sin, sin),
                 prefix_table_max_abs_diff=max((old_cos.float() - cos.float()).abs().max().item(),
                                               (old_sin.float() - sin.float()).abs().max().item()))

    rng = random.Random(seed)
    vocab = model.config.vocab_size
    prompts = [[rng.randrange(1, vocab) for _ in range(n)] for n in prompt_lengths]
    greedy = forced_decode(runner, prompts, new_tokens)
    fixed_cos, fixed_sin = runner.cos, runner.sin
    try:
        runner.cos, runner.sin = old_cos.to(runner.dtype), old_sin.to(runner.dtype)
        if runner.graphs is not None:
            runner.graphs.clear()  # captured graphs read the tables they were captured with
        control = forced_decode(runner, prompts, new_tokens, forced=greedy.tokens)
    finally:
        runner.cos, runner.sin = fixed_cos, fixed_sin
        if runner.graphs is not None:
            runner.graphs.clear()

    rows = []
    for row, (prompt, tokens) in enumerate(zip(prompts, greedy.tokens)):
        exact = reference_logits(reference, prompt, tokens)
        scale = exact.pow(2).mean().sqrt().item()
        hf_bf16 = reference_logits(model, prompt, tokens)
        ids = torch.tensor([prompt], device=device)
        with torch.inference_mode():
            generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                       min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        hf_tokens = generated[0, len(prompt):].tolist()
        rows.append(RopeRow(
            prompt_len=len(prompt),
            engine_error=(greedy.logits[:, row].float() - exact).abs().max().item() / scale,
            hf_bf16_error=(hf_bf16 - exact).abs().max().item() / scale,
            prefix_error=(control.logits[:, row].float() - exact).abs().max().item() / scale,
            tokens_equal_to_hf_generate=leading_equal(tokens, hf_tokens), new_tokens=new_tokens))
    return RopeResult(device=device, dtype="bfloat16", max_position=max_position, rows=rows, **table)
