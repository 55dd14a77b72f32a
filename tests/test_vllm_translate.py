"""The vLLM engine's translation to and from vLLM, its weight-name check and the install helpers, by hand.

These need no vLLM (they run in the main environment); `tests/test_vllm_engine.py` runs the engine on vLLM's
CPU build.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tailflow.config import ConfigError
from tailflow.engines.rollout.protocol import FinishReason, SamplingParams
from tailflow.engines.rollout.vllm_engine import require_vllm
from tailflow.engines.rollout.vllm_translate import (engine_kwargs, finish_reason_of, kv_cache_bytes,
                                                     sampled_logprobs, sampling_kwargs)
from tailflow.engines.rollout.vllm_weights import check_weight_names, checkpoint_shapes
from tailflow.engines.rollout.vllm_worker_hooks import PREFIX_DRAWS

REPO = Path(__file__).resolve().parents[1]


@dataclass
class RecordedLogprob:
    """The one field of `vllm.logprobs.Logprob` the engine reads."""

    logprob: float


def test_sampling_params_keep_the_seed_and_name_a_continued_requests_draws():
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=30, stop_token_ids=(5, 1), seed=11)
    assert sampling_kwargs(params, 11, eos_token_ids=(1,), num_prefix_tokens=0) == dict(
        n=1, temperature=0.7, top_p=0.9, top_k=20, seed=11, stop_token_ids=[1, 5], ignore_eos=True, max_tokens=30,
        logprobs=0, detokenize=False, extra_args=None)
    continued = sampling_kwargs(params, 11, eos_token_ids=(1,), num_prefix_tokens=4)
    assert continued["max_tokens"] == 26 and continued["seed"] == 11  # the prefix counts against max_new_tokens
    assert continued["extra_args"] == {PREFIX_DRAWS: 4}
    greedy = sampling_kwargs(SamplingParams(temperature=0.0, max_new_tokens=9), 3, (), num_prefix_tokens=4)
    assert greedy["extra_args"] is None  # a greedy request never draws


def test_engine_arguments_size_the_cpu_kv_cache_for_the_slots(random_tiny_model_dir):
    cpu = engine_kwargs(random_tiny_model_dir, num_slots=8, max_seq_len=300, seed=3, device="cpu")
    # the tiny model: 4 layers, 2 KV heads of 32; 300 tokens take 3 blocks of 128; fp32 keys and values
    assert cpu["kv_cache_memory_bytes"] == kv_cache_bytes(random_tiny_model_dir, 8, 300) == (8 * 3 + 1) * 128 * (
        2 * 4 * 2 * 32 * 4)
    assert (cpu["dtype"], cpu["enforce_eager"], cpu["logprobs_mode"]) == ("float32", True, "processed_logprobs")
    assert cpu["enable_chunked_prefill"] is False and cpu["max_num_batched_tokens"] >= 300
    assert "gpu_memory_utilization" not in cpu
    gpu = engine_kwargs(random_tiny_model_dir, 8, 300, 3, device="cuda", enable_sleep_mode=True,
                        gpu_memory_utilization=0.4)
    assert (gpu["dtype"], gpu["gpu_memory_utilization"], gpu["enable_sleep_mode"]) == ("bfloat16", 0.4, True)
    assert "kv_cache_memory_bytes" not in gpu


def test_sampled_logprobs_read_from_a_recorded_output_shape():
    # One dict per token (token id -> Logprob), the sampled token among them (logprobs=0 adds no other).
    positions = [{7: RecordedLogprob(-0.5), 3: RecordedLogprob(-0.1)}, {3: RecordedLogprob(-0.2)}]
    assert sampled_logprobs([7, 3], positions) == [-0.5, -0.2]
    with pytest.raises(RuntimeError, match="2 tokens with no log-prob positions"):
        sampled_logprobs([7, 3], None)


def test_finish_reasons_map_stop_to_eos_or_stop_by_the_last_token():
    eos = frozenset({1})
    assert finish_reason_of(None, [4], eos, "r") is None
    assert finish_reason_of("stop", [4, 1], eos, "r") == FinishReason.EOS
    assert finish_reason_of("stop", [4, 5], eos, "r") == FinishReason.STOP
    assert finish_reason_of("length", [4], eos, "r") == FinishReason.LENGTH
    assert finish_reason_of("abort", [4], eos, "r") == FinishReason.ABORT
    with pytest.raises(RuntimeError, match="'repetition'"):
        finish_reason_of("repetition", [4], eos, "r")


def test_weight_names_are_checked_against_the_checkpoint_before_any_moves(random_tiny_model_dir):
    from safetensors.torch import load_file

    expected = checkpoint_shapes(random_tiny_model_dir)
    state = load_file(str(random_tiny_model_dir / "model.safetensors"))
    assert set(state) == set(expected) and "lm_head.weight" not in expected  # tied: saved once
    check_weight_names(expected, state, tied_lm_head=True, version=1)
    check_weight_names(expected, {**state, "lm_head.weight": state["model.embed_tokens.weight"]}, True, 1)
    dropped = dict(state)
    del dropped["model.norm.weight"]
    with pytest.raises(KeyError, match=r"missing \['model.norm.weight'\], unexpected \[\], wrong shape \[\]"):
        check_weight_names(expected, dropped, True, 2)
    bad = {**state, "model.norm.weight": torch.zeros(3), "extra.bias": torch.zeros(1)}
    with pytest.raises(KeyError, match=r"unexpected \['extra.bias'\], wrong shape \['model.norm.weight'\]"):
        check_weight_names(expected, bad, True, 3)
    with pytest.raises(KeyError, match=r"unexpected \['lm_head.weight'\]"):
        check_weight_names(expected, {**state, "lm_head.weight": torch.zeros(1)}, False, 4)


def test_a_run_asking_for_vllm_without_it_names_the_install_script(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(ConfigError, match=r"rollout.engine vllm: vLLM is not installed .* scripts/install_vllm.sh"):
        require_vllm()


def test_a_broken_torchvision_is_named_at_import_with_the_fix(tmp_path):
    """A stand-in torchvision package that fails as the real mismatched build does (this environment has none)."""
    fake = tmp_path / "torchvision"
    fake.mkdir()
    (fake / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    result = subprocess.run([sys.executable, "-c", "import tailflow"], capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ImportError: torchvision is installed but does not import (operator torchvision::nms does not exist), and "
        "transformers fails with it: tailflow does not use it; remove it with `pip uninstall -y torchvision "
        "torchaudio torchcodec` (vLLM's wheels pull builds made for another torch)")


def test_the_install_list_leaves_out_the_mismatched_builds_and_unpins_fastapi(tmp_path):
    """scripts/vllm_requirements.py on a distribution written here with vLLM's kinds of requirements."""
    info = tmp_path / "fake_vllm-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fake-vllm\nVersion: 1.0\n"
        "Requires-Dist: fastapi[standard]<0.137.0,>=0.133.0\nRequires-Dist: torchvision\n"
        "Requires-Dist: torchaudio; platform_machine != \"s390x\"\nRequires-Dist: torchcodec>=0.14\n"
        "Requires-Dist: msgspec\nRequires-Dist: numba==0.65.0\nRequires-Dist: setuptools<81; python_version > \"9\"\n"
        "Requires-Dist: pandas; extra == \"bench\"\n")
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "vllm_requirements.py"), "fake-vllm"],
                         capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(tmp_path)})
    assert run.stdout.split() == ["fastapi[standard]", "msgspec", "numba==0.65.0"]
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "vllm_requirements.py"), "--check", "fake-vllm",
                            "1.0"], capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(tmp_path)})
    assert check.returncode == 1  # numba 0.65.0 and msgspec are not installed beside it here
