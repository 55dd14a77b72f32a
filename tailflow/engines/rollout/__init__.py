"""Rollout engines: requests in, completions out (see `protocol.py`)."""
from tailflow.engines.rollout.native import NativeEngine
from tailflow.engines.rollout.protocol import (
    Completion,
    EngineStats,
    FinishReason,
    Request,
    RolloutEngine,
    SamplingParams,
)
from tailflow.engines.rollout.vllm_engine import VllmEngine  # imports vLLM only when one is built
from tailflow.engines.rollout.worker import RolloutWorker

__all__ = [
    "Completion",
    "EngineStats",
    "FinishReason",
    "NativeEngine",
    "Request",
    "RolloutEngine",
    "RolloutWorker",
    "SamplingParams",
    "VllmEngine",
]
