"""What the run report draws, read from the run's files one line at a time.

The report is redrawn every `tracking.report_every` iterations for as long as a run lasts, in the run's driver. So
a redraw keeps only what it draws: `metrics.jsonl` becomes one float array per drawn column (8 bytes per row and
column) and `rollout_trace.jsonl` a count per response length. Measured with `bench/report_memory.py` (a process
redrawing every 100 rows, to 2,000): reading both files whole, every row a dict, grew its RSS +1.45 MB per 100
rows, streaming them +1.07, each followed by the driver's garbage collection (driver/garbage.py; without it +6.53
and +4.36).
"""
from __future__ import annotations

import json
import math
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

from tailflow.engines.runs.commit import read_latest
from tailflow.engines.runs.layout import metrics_key, rollout_trace_key

STEP_PARTS = (("time/step_generate", "generate"), ("time/step_reward", "reward"), ("time/step_train", "train"),
              ("time/step_model_update", "sync"), ("time/eval", "eval"))
DRAWN = ("reward/mean", "reward/accuracy", "eval/accuracy", "eval/accuracy_initial", "tail/long_queue_size",
         "tail/round", "tail/wasted_tokens", *(name for name, _ in STEP_PARTS), "env/turns_mean", "env/turns_max",
         "env/failures", "env/dropped", "time/env_step_s_mean")
"""The metrics the report's plots and table use; every other column of a row is dropped as it is read."""


def lines_of(store: Any, key: str) -> Iterator[str]:
    """The object's non-empty lines, streamed from the store (`read_lines`)."""
    return (line for line in store.read_lines(key) if line.strip())


@dataclass
class MetricColumns:
    """The drawn columns of the rows of committed iterations, in file order; NaN where a row lacks a value."""
    iterations: array = field(default_factory=lambda: array("q"))
    values: dict[str, array] = field(default_factory=lambda: {name: array("d") for name in DRAWN})

    @classmethod
    def of_rows(cls, rows: Any) -> "MetricColumns":
        columns = cls()
        for row in rows:
            columns.add(row)
        return columns

    def add(self, row: dict[str, Any]) -> None:
        self.iterations.append(row["iteration"])
        for name, column in self.values.items():
            value = row.get(name)
            column.append(math.nan if value is None else float(value))

    def __len__(self) -> int:
        return len(self.iterations)

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """(iterations, values) of the rows that have `name`."""
        points = [(x, y) for x, y in zip(self.iterations, self.values[name]) if not math.isnan(y)]
        return [x for x, _ in points], [y for _, y in points]

    def filled(self, name: str) -> list[float]:
        """The column with 0.0 where a row lacks it (one value per row, for stacked areas)."""
        return [0.0 if math.isnan(y) else y for y in self.values[name]]

    def first(self, name: str) -> float | None:
        return next((y for y in self.values[name] if not math.isnan(y)), None)


def read_columns(store: Any, run_id: str) -> MetricColumns:
    """The drawn columns of `metrics.jsonl`'s committed rows (rows past the commit may be run again)."""
    latest = read_latest(store, run_id)
    committed = latest.iteration if latest else 0
    columns = MetricColumns()
    key = metrics_key(run_id)
    if store.exists(key):
        for line in lines_of(store, key):
            row = json.loads(line)
            if row["iteration"] < committed:
                columns.add(row)
    return columns


def model_length(response: dict[str, Any]) -> int:
    """A traced response's tokens the model sampled: its length, or a trajectory's turns' model tokens."""
    if "turns" in response:
        return sum(turn["model_tokens"] for turn in response["turns"])
    return response["length"]


def response_lengths(store: Any, run_id: str) -> dict[str, Counter[int]]:
    """How many responses that ended by themselves had each length, by round kind (short, long, sync), from the
    trace (a trajectory's: its model tokens, as `token/response_length/*` counts them)."""
    key = rollout_trace_key(run_id)
    lengths: dict[str, Counter[int]] = {}
    if not store.exists(key):
        return lengths
    for line in lines_of(store, key):
        round_ = json.loads(line)
        lengths.setdefault(round_["round"], Counter()).update(
            model_length(response) for prompt in round_["prompts"] for response in prompt["responses"]
            if response["finish"] != "abort")
    return lengths
