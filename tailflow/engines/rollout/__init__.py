"""Rollout engines: requests in, completions out (see `protocol.py`).

The engines and the worker load on first use (PEP 562 `__getattr__`), not when the package does: the driver
imports `protocol` for its records, and the native engine's import pulls in transformers' model code (~2.5 CPU-s a
process start, measured 2026-11-27), which only a rollout worker's process needs."""
from importlib import import_module

from tailflow.engines.rollout.protocol import (
    Completion,
    EngineStats,
    FinishReason,
    Request,
    RolloutEngine,
    SamplingParams,
)

_LAZY = {"NativeEngine": "native", "VllmEngine": "vllm_engine", "RolloutWorker": "worker"}

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


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
