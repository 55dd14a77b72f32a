"""The engine contract (`engine_contract.py`) on every engine and device this machine has.

The native engine on CPU always runs, eagerly and with its decode padded to
the CUDA-graph buckets (fp32, exact). The native engine on CUDA skips, saying
why, where torch sees no GPU; `scripts/gpu_evidence.sh` runs this file on a
lent GPU. Another engine joins by adding a class with its own `engine_case`
(`tests/test_vllm_engine.py` does so for the vLLM engine, on vLLM's CPU build: docs/gpu.md).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from engine_contract import EngineCase, EngineContract, one_thread  # noqa: F401 (autouse fixture)
from tailflow.engines.models import load_model
from tailflow.engines.rollout.native import NativeEngine


def native_case(device: str, bucketed_decode: bool | None = None) -> EngineCase:
    def make(model_dir, num_slots, max_seq_len, seed=0):
        return NativeEngine(load_model(model_dir), num_slots, max_seq_len, seed=seed, device=device,
                            bucketed_decode=bucketed_decode)

    exact = device == "cpu"
    return EngineCase(name=f"native-{device}", device=device, make=make,
                      dtype=torch.float32 if exact else torch.bfloat16, exact=exact)


class TestNativeEngineOnCPU(EngineContract):
    @pytest.fixture
    def engine_case(self) -> EngineCase:
        return native_case("cpu")


class TestNativeEngineBucketedOnCPU(EngineContract):
    """The decode step padded to CUDA-graph buckets, run eagerly: padding must change no token or logprob."""

    @pytest.fixture
    def engine_case(self) -> EngineCase:
        return native_case("cpu", bucketed_decode=True)


class TestNativeEngineOnVllmShapesOnCPU(EngineContract):
    """The head size the vLLM contract uses (32: vLLM's attention backends refuse the default models' 12), so
    the models the vLLM class runs on are checked on the native engine too."""

    @pytest.fixture
    def engine_case(self) -> EngineCase:
        return dataclasses.replace(native_case("cpu"), head_dim=32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device here")
class TestNativeEngineOnCUDA(EngineContract):
    @pytest.fixture
    def engine_case(self) -> EngineCase:
        return native_case("cuda")
