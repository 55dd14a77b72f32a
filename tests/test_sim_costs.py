"""Cost models against numbers worked out by hand, and calibration files that must be refused."""
from __future__ import annotations

import json
import random

import pytest

from tailflow.engines.sim.costs import CostModelError
from tailflow.engines.sim.roofline import Efficiency, RooflineCost, sum_max_linear
from tailflow.engines.sim.table_cost import TableCost, read_table

# Qwen2.5-7B: 7.61e9 parameters, 28 layers, 28 heads, 4 KV heads, head dim 128. H100: 3.35e12 B/s, 989e12 FLOP/s.
# Efficiencies: memory 0.75, compute 0.6, 2 ms per step; memory utilisation 0.85; MFU 0.35, 2 extra forwards.


def test_decode_step_is_memory_bound_at_few_rows():
    cost = RooflineCost.from_presets("h100", "qwen2.5-7b", num_gpus=1, tp=1)
    weights = 2 * 7.61e9 / (3.35e12 * 0.75)                  # 6.0577 ms: every weight read once
    kv = 4000 * (2 * 2 * 28 * 4 * 128) / (3.35e12 * 0.75)    # 57,344 B of keys+values per context token
    flops = (2 * 7.61e9 * 4 + 4 * 28 * 28 * 128 * 4000) / (989e12 * 0.6)
    assert flops < weights + kv
    assert cost.decode_s(4, 4000, 1000) == pytest.approx(weights + kv + 0.002, rel=1e-9)
    assert cost.decode_s(4, 4000, 1000) == pytest.approx(8.14900e-3, rel=1e-5)


def test_decode_step_is_compute_bound_at_many_rows():
    cost = RooflineCost.from_presets("h100", "qwen2.5-7b", num_gpus=1, tp=1)
    assert cost.decode_s(512, 0, 0) == pytest.approx(512 * 2 * 7.61e9 / (989e12 * 0.6) + 0.002, rel=1e-9)  # 15.13 ms
    # flat while memory-bound: 4 rows cost what 64 rows cost, give or take their KV reads
    assert cost.decode_s(64, 0, 0) == pytest.approx(cost.decode_s(4, 0, 0))


def test_tensor_parallel_all_reduce_and_kv_budget():
    cost = RooflineCost.from_presets("h100", "qwen2.5-14b", num_gpus=2, tp=2)
    # 2 all-reduces per layer x 48 layers, each 64 rows x 5120 x 2 B = 655,360 B over a 2-GPU NVLink ring at
    # 450 GB/s: NCCL's LL, 6.6 us + 2 steps x 0.47 us + 655,360 B / (450 GB/s / 4) = 13.365 us, beats Simple
    # (8.4 + 2 x 3.4 us + 655,360 B / 450 GB/s = 16.656 us)
    one = 6.6e-6 + 2 * 0.47e-6 + 655_360 / (450e9 / 4)
    assert cost.allreduce_s(64) == pytest.approx(2 * 48 * one, rel=1e-9)
    assert cost.allreduce_s(64) == pytest.approx(1.28308e-3, rel=1e-5)
    one_gpu = RooflineCost.from_presets("h100", "qwen2.5-7b", 1, 1)
    assert one_gpu.kv_budget_tokens == int((80e9 * 0.85 - 2 * 7.61e9) // 57344) == 920_410


def test_training_time_is_flops_over_cluster_mfu_plus_fsdp_collectives():
    cost = RooflineCost.from_presets("h800", "qwen2.5-7b", num_gpus=16, tp=1)
    # (6 forward+backward + 2 x 2 extra forwards) x params x tokens / (GPUs x peak x MFU), at the slowest of 16
    # GPUs' pace (1 + 0.08 x 16/17); plus 5 all-gathers of the 15.22 GB of bf16 weights over 16 GPUs on 2 nodes:
    # NCCL Simple, 8.4 us + 14 NVLink steps x 3.4 us + 1 network step x 9.6 us + 15.22e9 B / (50 GB/s x 16/15)
    compute = 10 * 7.61e9 * 1e6 / (16 * 989e12 * 0.35) * (1 + 0.08 * 16 / 17)
    gather = 8.4e-6 + 14 * 3.4e-6 + 9.6e-6 + 15.22e9 / (50e9 * 16 / 15)
    assert cost.train_s(10**6) == pytest.approx(compute + 5 * gather, rel=1e-9)
    assert cost.train_s(10**6) == pytest.approx(14.7750 + 1.4272, rel=1e-4)


def test_span_closed_form_equals_step_by_step_sum():
    rng = random.Random(0)
    for model, tp in (("qwen2.5-7b", 1), ("qwen2.5-32b", 2)):
        cost = RooflineCost.from_presets("h800", model, 8, tp)
        for _ in range(30):
            rows, context, steps = rng.choice([1, 3, 40, 300, 900]), rng.randrange(0, 2_000_000), rng.randrange(1, 400)
            looped = sum(cost.decode_s(rows, context + rows * j, 0) for j in range(steps))
            assert cost.decode_span_s(rows, context, 0, steps) == pytest.approx(looped, rel=1e-9)


def test_sum_max_linear_when_the_lines_cross():
    # max(10 - j, 2 + j) for j = 0..9: 10 9 8 7 6 7 8 9 10 11 = 85
    assert sum_max_linear(10, -1, 2, 1, 10) == 85


@pytest.mark.parametrize("name,kwargs,message", [
    ("hardware", {"hardware": "tpu-v5"}, "--hardware: unknown preset 'tpu-v5'"),
    ("model", {"model": "llama-70b"}, "--model: unknown preset 'llama-70b'"),
    ("tp", {"num_gpus": 6, "tp": 4}, "--gpus 6 must be a positive multiple of --tp 4"),
])
def test_bad_presets_are_one_line_errors(name, kwargs, message):
    args = {"hardware": "h100", "model": "qwen2.5-7b", "num_gpus": 8, "tp": 1} | kwargs
    with pytest.raises(CostModelError, match=message.replace("(", r"\(")):
        RooflineCost.from_presets(**args)


def test_a_model_that_does_not_fit_names_tp():
    half = Efficiency(gpu_memory_utilization=0.5)
    with pytest.raises(CostModelError, match="raise --tp"):
        RooflineCost.from_presets("a100", "qwen2.5-32b", 8, 1, half).kv_budget_tokens  # 65 GB of weights in 40 GB
    assert RooflineCost.from_presets("a100", "qwen2.5-32b", 8, 2, half).kv_budget_tokens > 0


def table_json(**overrides) -> dict:
    data = {"format": "tailflow-step-costs/1", "kind": "measured", "device": "test", "engine": "vllm",
            "model": "m", "tp": 1, "attention": "padded", "rows": [1, 3], "context": [10, 30],
            "decode_seconds": [[1.0, 2.0], [3.0, 5.0]], "prefill_seconds": [[0.1, 0.3], [0.3, 0.9]]}
    return data | overrides


def write(tmp_path, data) -> str:
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_table_interpolates_bilinearly_and_extends_the_last_slope(tmp_path):
    cost = TableCost.from_file(write(tmp_path, table_json()))
    # rows 2 (half way 1 -> 3), longest context 20 (half way 10 -> 30): mean of 1, 2, 3, 5
    assert cost.decode_s(2, 999, 20) == pytest.approx(2.75)
    assert cost.decode_s(1, 0, 5) == pytest.approx(1.0)            # below the grid: its first point
    assert cost.decode_s(5, 0, 30) == pytest.approx(5.0 + 2 * 1.5)  # past 3 rows: slope (5-2)/2 a row
    # paged attention pays the mean context (40 tokens over 2 rows = 20), padded the longest
    paged = TableCost.from_file(write(tmp_path, table_json(attention="paged")))
    assert paged.decode_s(2, 40, 30) == pytest.approx(2.75)
    assert cost.prefill_s(2 * 20, 2) == pytest.approx((0.1 + 0.3 + 0.3 + 0.9) / 4)


@pytest.mark.parametrize("change,message", [
    ({"format": "other/1"}, "field 'format' is 'other/1'"),
    ({"rows": [3, 1]}, "field 'rows' must be >= 2 increasing positive integers"),
    ({"decode_seconds": [[1.0, 2.0]]}, "field 'decode_seconds' must be 2 lists"),
    ({"decode_seconds": [[1.0, 0.0], [3.0, 5.0]]}, "field 'decode_seconds' must hold positive seconds"),
    ({"attention": "flash"}, "field 'attention' must be 'padded' or 'paged'"),
])
def test_bad_calibration_files_name_the_file_and_field(tmp_path, change, message):
    path = write(tmp_path, table_json(**change))
    with pytest.raises(CostModelError) as error:
        read_table(path)
    assert str(error.value).startswith(path) and message in str(error.value) and "\n" not in str(error.value)


def test_missing_field_and_unreadable_files(tmp_path):
    data = table_json()
    del data["prefill_seconds"]
    with pytest.raises(CostModelError, match="missing field 'prefill_seconds'"):
        read_table(write(tmp_path, data))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CostModelError, match="bad.json: not a JSON calibration file"):
        read_table(tmp_path / "bad.json")
    with pytest.raises(CostModelError, match="no such calibration file"):
        read_table(tmp_path / "absent.json")
