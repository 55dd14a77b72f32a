"""`tailflow calibrate`: measure this machine's native engine over a grid of rows x context.

For each grid point an engine with exactly `rows` slots takes `rows` requests
whose prompts are `context` tokens long, EOS disabled, and decodes a few
steps: the first step also prefills (its excess over a decode step is the
prefill point), the median of the rest is the decode point.

With one torch thread (the default) a step is timed by the CPU time of the
calling thread, not the wall clock: on a machine shared with other work
(this one runs other agents' jobs) the wall clock measures the neighbours
too, while the engine's own CPU time is what an idle machine's wall time
would be. With more threads the wall clock is used (their CPU time adds up).
Writes the `cpu` calibration file (table_cost.py describes the format).
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from tailflow.engines.sim.table_cost import StepCostTable

ROWS = (1, 4, 16, 32, 64, 128)
CONTEXT = (16, 128, 384, 768)
QUICK_ROWS = (1, 4, 16)
QUICK_CONTEXT = (16, 64)


@dataclass(frozen=True)
class GridPoint:
    rows: int
    context: int
    decode_s: float
    prefill_s: float


def step_clock(num_threads: int):
    """The clock a step is timed with (see the module doc): thread CPU time for one thread, else wall time."""
    return time.thread_time if num_threads == 1 else time.perf_counter


def measure_point(model, rows: int, context: int, steps: int, seed: int, clock=time.thread_time) -> GridPoint:
    from tailflow.engines.rollout import NativeEngine, Request, SamplingParams

    rng = random.Random(seed)
    vocab = model.config.vocab_size
    engine = NativeEngine(model, rows, context + steps + 1, seed=seed, eos_token_ids=())
    params = SamplingParams(temperature=1.0, max_new_tokens=steps)
    engine.submit([Request(f"r{i}", tuple(rng.randrange(vocab) for _ in range(context)), params) for i in range(rows)])
    durations = []
    for _ in range(steps):
        started = clock()
        engine.step()
        durations.append(clock() - started)
    decode = statistics.median(durations[1:])
    return GridPoint(rows, context, decode, max(durations[0] - decode, 0.0))


def median_point(same: list[GridPoint]) -> GridPoint:
    """One grid point measured in several sweeps -> its median decode and prefill times."""
    first = same[0]
    return GridPoint(first.rows, first.context, statistics.median(p.decode_s for p in same),
                     statistics.median(p.prefill_s for p in same))


def calibrate_cpu(model_path: str | Path, num_threads: int = 1, steps: int = 10, passes: int = 3, quick: bool = False,
                  seed: int = 0) -> StepCostTable:
    """`passes` sweeps over the whole grid, each point's median taken across them: a burst of load from
    elsewhere hits one sweep's points, not one point's every measurement."""
    import torch

    from tailflow.engines.models import load_model

    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        model = load_model(model_path)
        rows_axis, context_axis = (QUICK_ROWS, QUICK_CONTEXT) if quick else (ROWS, CONTEXT)
        clock = step_clock(num_threads)
        measure_point(model, 2, 16, 3, seed, clock)  # warm-up: first calls allocate
        sweeps = [[measure_point(model, rows, context, steps, seed, clock) for rows in rows_axis
                   for context in context_axis] for _ in range(max(passes, 1))]
    finally:
        torch.set_num_threads(previous)
    points = [median_point([sweep[index] for sweep in sweeps]) for index in range(len(sweeps[0]))]
    by_point = {(p.rows, p.context): p for p in points}
    decode = tuple(tuple(by_point[r, c].decode_s for c in context_axis) for r in rows_axis)
    prefill = tuple(tuple(by_point[r, c].prefill_s for c in context_axis) for r in rows_axis)
    return StepCostTable(
        kind="cpu", engine="native",
        device=f"CPU, {num_threads} torch thread(s), torch {torch.__version__}, timed by "
               f"{'thread CPU time' if num_threads == 1 else 'wall clock'}",
        model=str(model_path), tp=1, attention="padded", rows=tuple(rows_axis), context=tuple(context_axis),
        decode_seconds=decode, prefill_seconds=prefill)
