from tailflow.engines.track.metrics import MetricsLogger, start_wandb

__all__ = ["MetricsLogger", "start_wandb"]
