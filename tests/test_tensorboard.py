"""tracking.tensorboard: committed rows reach TensorBoard event files under the metric names of metrics.jsonl."""
from __future__ import annotations

import pytest

from tailflow.engines.store import LocalStore
from tailflow.engines.track import MetricsLogger
from tailflow.engines.track.tensorboard import start_tensorboard


def test_published_rows_are_read_back_from_the_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    store = LocalStore(tmp_path)
    board = start_tensorboard(True, store.path("r1"))
    logger = MetricsLogger(store, "r1", tensorboard=board)
    rows = [{"iteration": i, "reward/mean": 0.25 * i, "time/step_total": 1.5, "tail/round": i % 2,
             "eval/accuracy": None} for i in range(3)]
    for row in rows:
        logger.append(row)
        logger.publish(row)
    logger.close()
    events = EventAccumulator(str(tmp_path / "r1" / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"reward/mean", "time/step_total", "tail/round"}  # None is not logged
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert start_tensorboard(False, tmp_path) is None
