"""What a run records: the metrics row and its loggers (W&B, TensorBoard), the report, the rollout trace, tail
batching's length bias and the live progress line. Kept apart because it only reads the records the other
packages hand over (`IterationOutcome`, `TakenRound`, completions) and decides nothing a run does, so what is
logged and where can change without touching rollout or training."""
from tailflow.engines.track.metrics import MetricsLogger, start_wandb

__all__ = ["MetricsLogger", "start_wandb"]
