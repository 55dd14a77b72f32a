"""Metrics: one JSON row per iteration in the run's `metrics.jsonl`, W&B optional.

Keys follow ARCHITECTURE.md (`time/step_total`, `reward/mean`, ...) so plots
made for ROLL / RollPacker carry over.
"""
from __future__ import annotations

import json
import math
from collections import deque
from typing import Any

from tailflow.engines.runs.layout import metrics_key
from tailflow.engines.store import ArtifactStore


TIMING_PREFIX = "time/"
"""Every metric derived from a wall clock lives under `time/`, so a seeded rerun or a resumed twin reproduces
every other key exactly (docs/operations.md, Which metrics a resume reproduces: the keys, and the exception)."""


def without_timing(row: dict[str, Any]) -> dict[str, Any]:
    """The row's reproducible part: no `time/*` key."""
    return {k: v for k, v in row.items() if not k.startswith(TIMING_PREFIX)}


def jsonable_row(row: dict[str, Any]) -> dict[str, Any]:
    """Plain JSON numbers: NaN/inf become None so every row parses anywhere."""
    return {name: None if isinstance(value, float) and not math.isfinite(value) else value
            for name, value in row.items()}


RECENT_ROWS = 100
"""Rows the logger keeps in memory: what the parent flow shows per iteration (the UI's metrics table), read
without reading metrics.jsonl, which grows with the run."""


class MetricsLogger:
    def __init__(self, store: ArtifactStore, run_id: str, wandb_run: Any = None, tensorboard: Any = None):
        self.store = store
        self.key = metrics_key(run_id)
        self.recent: deque[dict[str, Any]] = deque(self.rows()[-RECENT_ROWS:], maxlen=RECENT_ROWS)
        """The newest rows appended (on a resume, first the file's last ones), as `rows` reads them."""
        self.wandb_run = wandb_run
        self.tensorboard = tensorboard
        """TensorBoardLog (tracking.tensorboard) or None."""

    def log(self, row: dict[str, Any]) -> None:
        self.append(row)
        self.publish(row)

    def append(self, row: dict[str, Any]) -> None:
        """The row into metrics.jsonl (before the iteration commits; `keep_committed` drops it if that fails)."""
        line = json.dumps(jsonable_row(row), sort_keys=True)
        self.store.append_line(self.key, line)
        self.recent.append(json.loads(line))

    def publish(self, row: dict[str, Any]) -> None:
        """The row to W&B (after the commit, so W&B never sees an iteration that is run again)."""
        if self.wandb_run is not None:
            self.wandb_run.log(jsonable_row(row), step=row.get("iteration"))
        if self.tensorboard is not None:
            self.tensorboard.log(jsonable_row(row))

    def keep_committed(self, num_iterations: int) -> None:
        """On resume: drop rows of iterations >= `num_iterations` (written, never committed)."""
        rows = self.rows()
        kept = [row for row in rows if row["iteration"] < num_iterations]
        if len(kept) != len(rows):
            self.store.write_text(self.key, "".join(json.dumps(row, sort_keys=True) + "\n" for row in kept))
        self.recent = deque(kept[-RECENT_ROWS:], maxlen=RECENT_ROWS)

    def rows(self) -> list[dict[str, Any]]:
        if not self.store.exists(self.key):
            return []
        return [json.loads(line) for line in self.store.read_text(self.key).splitlines() if line.strip()]

    def close(self) -> None:
        if self.wandb_run is not None:
            self.wandb_run.finish()
        if self.tensorboard is not None:
            self.tensorboard.close()


def start_wandb(run_id: str, project: str, mode: str, config: dict[str, Any], directory: str) -> Any:
    """A W&B run named after the run id; offline mode needs no network."""
    import wandb

    return wandb.init(project=project, name=run_id, id=run_id, mode=mode, config=config, dir=directory, resume="allow")
