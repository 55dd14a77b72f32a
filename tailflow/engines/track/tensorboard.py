"""TensorBoard event files beside W&B (`tracking.tensorboard`), with the metric names of metrics.jsonl.

Written by torch's SummaryWriter (needs the `tensorboard` package: `pip install tailflow[tensorboard]`).
Event files are local: in the run's own folder for a local store, in a cache folder for S3 (upload or
point `tensorboard --logdir` at it). Rows arrive only after their iteration commits, as for W&B.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tailflow.config import ConfigError


def require_tensorboard() -> None:
    """Fail with the config key named when `tracking.tensorboard` is on but the package is missing."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise ConfigError("tracking.tensorboard: the tensorboard package is not installed "
                          "(pip install tailflow[tensorboard])") from None


class TensorBoardLog:
    def __init__(self, directory: Path):
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(directory))

    def log(self, row: dict[str, Any]) -> None:
        step = row.get("iteration")
        for name, value in row.items():
            if name != "iteration" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def start_tensorboard(enabled: bool, working_dir: Path) -> TensorBoardLog | None:
    """Event files under `<working_dir>/tensorboard/` when `tracking.tensorboard` is on."""
    return TensorBoardLog(working_dir / "tensorboard") if enabled else None
