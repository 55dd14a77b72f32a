"""What a run records: the metrics row and its loggers (W&B, TensorBoard), the report, the rollout trace, tail
batching's length bias and the live progress line."""
from tailflow.engines.track.metrics import MetricsLogger, start_wandb

__all__ = ["MetricsLogger", "start_wandb"]
