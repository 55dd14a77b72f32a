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
from contextlib import contextmanager
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


class CpuCalibration:
    """Sweeps over the grid, taken whenever the caller likes (bench/sim_validate.py spreads them between the
    rounds it validates, so the model sees the same machine load as the workload); `table()` takes each
    point's median across sweeps, so a burst of load from elsewhere hits one sweep, not every measurement."""

    def __init__(self, model_path: str | Path, num_threads: int = 1, steps: int = 10, quick: bool = False,
                 seed: int = 0) -> None:
        from tailflow.engines.models import load_model

        self.model_path, self.num_threads, self.steps, self.seed = model_path, num_threads, steps, seed
        self.rows_axis, self.context_axis = (QUICK_ROWS, QUICK_CONTEXT) if quick else (ROWS, CONTEXT)
        self.model = load_model(model_path)
        self.clock = step_clock(num_threads)
        self.sweeps: list[list[GridPoint]] = []
        with torch_threads(num_threads):
            measure_point(self.model, 2, 16, 3, seed, self.clock)  # warm-up: first calls allocate

    def sweep(self) -> None:
        with torch_threads(self.num_threads):
            self.sweeps.append([measure_point(self.model, rows, context, self.steps, self.seed, self.clock)
                                for rows in self.rows_axis for context in self.context_axis])

    def table(self) -> StepCostTable:
        import torch

        points = [median_point([sweep[index] for sweep in self.sweeps]) for index in range(len(self.sweeps[0]))]
        by_point = {(p.rows, p.context): p for p in points}
        rows_axis, context_axis = self.rows_axis, self.context_axis
        return StepCostTable(
            kind="cpu", engine="native",
            device=f"CPU, {self.num_threads} torch thread(s), torch {torch.__version__}, timed by "
                   f"{'thread CPU time' if self.num_threads == 1 else 'wall clock'}, {len(self.sweeps)} sweeps",
            model=str(self.model_path), tp=1, attention="padded", rows=tuple(rows_axis), context=tuple(context_axis),
            decode_seconds=tuple(tuple(by_point[r, c].decode_s for c in context_axis) for r in rows_axis),
            prefill_seconds=tuple(tuple(by_point[r, c].prefill_s for c in context_axis) for r in rows_axis))


@contextmanager
def torch_threads(num_threads: int):
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def calibrate_cpu(model_path: str | Path, num_threads: int = 1, steps: int = 10, passes: int = 3, quick: bool = False,
                  seed: int = 0) -> StepCostTable:
    """`passes` sweeps in a row (`tailflow calibrate`)."""
    calibration = CpuCalibration(model_path, num_threads, steps, quick, seed)
    for _ in range(max(passes, 1)):
        calibration.sweep()
    return calibration.table()
