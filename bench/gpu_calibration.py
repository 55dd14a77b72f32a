"""The native engine's step costs on a grid of rows x context, as the simulator's `measured` cost model reads them.

Models are built from Qwen2.5 shapes (each checkpoint's config.json numbers)
with random weights, on the device, in the engine's dtype: no download, and a
step's time does not depend on the weights' values.

Decode point (rows, context): an engine with `rows` slots holds `rows`
requests whose prompts end just below `context` tokens. Their prompts are not
prefilled: each sequence is marked as cached and the KV cache is filled with
random numbers (values do not change a step's time; a real prefill of 256 x 8k
tokens would cost minutes). Then `engine.step()` (graph replay, sampling, the
engine's Python) runs a few warm-up steps (graph capture) and `steps` timed
ones, the last at key length `context`; the median is the point.

Prefill point: `rows` prompts of `context` tokens admitted in one step, timed,
minus the decode median. Measured where rows x context <= `max_prefill_tokens`;
above that, scaled linearly in rows from the largest measured row count at that
context (the engine prefills in chunks of <= 16k tokens, so its prefill cost is
linear in rows there). The JSON's `notes` says which points were scaled.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

import torch

from tailflow.engines.rollout import NativeEngine, Request, SamplingParams
from tailflow.engines.sim.table_cost import StepCostTable

# Qwen2.5 config.json: hidden, intermediate, layers, heads, KV heads, vocab, tied embeddings (head_dim 64/128/128).
QWEN25 = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
TINY = {"tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=256, tie_word_embeddings=True)}
ROWS = (1, 4, 16, 64, 256)
CONTEXT = (512, 1024, 2048, 4096, 8192)
WARMUP_STEPS = 3


def build_model(shape: dict, device: str, dtype: torch.dtype, seed: int = 0):
    """A random Qwen2 of `shape`, created directly on `device` in `dtype` (a 7B fp32 copy is never made)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**shape, max_position_embeddings=32768, rms_norm_eps=1e-6, eos_token_id=None,
                         pad_token_id=0, bos_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return Qwen2ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)


def synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def kv_bytes(model, rows: int, max_seq_len: int) -> int:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * rows * c.num_key_value_heads * max_seq_len * head_dim * model.dtype.itemsize


def rows_that_fit(model, rows_axis, max_context: int, device: str, budget_fraction: float = 0.7) -> tuple[int, ...]:
    """Row counts whose KV cache at the largest context fits in `budget_fraction` of free GPU memory."""
    if torch.device(device).type != "cuda":
        return tuple(rows_axis)
    free, _ = torch.cuda.mem_get_info()
    return tuple(r for r in rows_axis if kv_bytes(model, r, max_context + 1) <= budget_fraction * free)


def timed_step(engine: NativeEngine, device: str) -> float:
    synchronize(device)
    started = time.perf_counter()
    engine.step()  # ends in .tolist(): the device is done when it returns
    return time.perf_counter() - started


def decode_point(engine: NativeEngine, rows: int, context: int, steps: int, device: str, rng: random.Random) -> float:
    """Median `engine.step()` over `steps` decode steps of `rows` rows ending at key length `context`."""
    total = WARMUP_STEPS + steps
    prompt_len = context - total
    vocab = engine.vocab_size
    params = SamplingParams(temperature=1.0, max_new_tokens=total + 1)
    engine.submit([Request(f"d{rows}x{context}#{i}", tuple(rng.randrange(vocab) for _ in range(prompt_len)), params)
                   for i in range(rows)])
    for seq in engine.scheduler.admit():  # marked cached instead of prefilled (see the module doc)
        seq.num_cached = prompt_len - 1
    durations = [timed_step(engine, device) for _ in range(total)]
    engine.abort([seq.request_id for seq in list(engine.scheduler.running)])
    return statistics.median(durations[WARMUP_STEPS:])


def prefill_point(engine: NativeEngine, rows: int, context: int, decode_s: float, device: str,
                  rng: random.Random) -> float:
    vocab = engine.vocab_size
    params = SamplingParams(temperature=1.0, max_new_tokens=1)
    engine.submit([Request(f"p{rows}x{context}#{i}", tuple(rng.randrange(vocab) for _ in range(context)), params)
                   for i in range(rows)])
    seconds = timed_step(engine, device)
    assert not engine.has_unfinished()
    return max(seconds - decode_s, 0.0)


@dataclass(frozen=True)
class Calibration:
    table: StepCostTable
    notes: str


def calibrate_model(name: str, shape: dict, device: str, rows_axis=ROWS, context_axis=CONTEXT, steps: int = 10,
                    max_prefill_tokens: int = 65536, seed: int = 0) -> Calibration:
    from tailflow.engines.rollout.native import default_dtype

    dtype = default_dtype(device)
    model = build_model(shape, device, dtype, seed)
    rows_axis = rows_that_fit(model, rows_axis, max(context_axis), device)
    if device != "cpu":
        free, total = torch.cuda.mem_get_info()
        print(f"{name}: rows {rows_axis} fit 70% of {free / 2**30:.1f} GiB free (of {total / 2**30:.1f})", flush=True)
    rng = random.Random(seed)
    engine = None
    decode: dict[tuple[int, int], float] = {}
    prefill: dict[tuple[int, int], float] = {}
    for rows in rows_axis:
        engine = None  # the last row count's cache, graphs and fused weights go before the next are allocated
        if device != "cpu":
            torch.cuda.empty_cache()
        engine = NativeEngine(model, rows, max(context_axis) + 1, seed=seed, eos_token_ids=(), device=device)
        engine.runner.cache.k.normal_()
        engine.runner.cache.v.normal_()
        for context in context_axis:
            decode[rows, context] = decode_point(engine, rows, context, steps, device, rng)
            if rows * context <= max_prefill_tokens:
                prefill[rows, context] = prefill_point(engine, rows, context, decode[rows, context], device, rng)
        del engine
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    scaled = []
    for context in context_axis:
        measured = [r for r in rows_axis if (r, context) in prefill]
        for rows in rows_axis:
            if (rows, context) not in prefill:
                base = max(measured) if measured else None
                if base is None:
                    raise RuntimeError(f"no prefill measured at context {context}: raise max_prefill_tokens")
                prefill[rows, context] = prefill[base, context] * rows / base
                scaled.append(f"{rows}x{context}")
    table = StepCostTable(
        kind="measured", device=device_name(device), engine="native", model=name, tp=1, attention="padded",
        rows=tuple(rows_axis), context=tuple(context_axis),
        decode_seconds=tuple(tuple(decode[r, c] for c in context_axis) for r in rows_axis),
        prefill_seconds=tuple(tuple(prefill[r, c] for c in context_axis) for r in rows_axis))
    notes = (f"{name} shapes with random weights, {dtype}; decode = median engine.step() of {steps} after "
             f"{WARMUP_STEPS} warm-up; prefill scaled linearly in rows (not measured) at: {', '.join(scaled) or 'none'}")
    return Calibration(table, notes)


def device_name(device: str) -> str:
    if torch.device(device).type == "cuda":
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return f"CPU (dry run), torch {torch.__version__}"
