"""`cluster.device: gpu` wired end to end, checked without a GPU: Ray's logical GPUs with the tensors on the CPU
(`TAILFLOW_CUDA_STAND_IN=cpu`, the named stand-in for the device this machine lacks). What this proves: the
placement groups are reserved, every actor sits where the layout says, the trainer ranks meet at rank 0's node,
the phases take turns, seats are reused and released, and none of it changes a single bit of the run. What it
cannot prove: anything about CUDA itself (docs/gpu.md says what has run where)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tailflow.config import ConfigError, load_config
from tailflow.engines.cluster.placement import CUDA_STAND_IN, takes_turns, torch_device
from tailflow.engines.models import write_random_tiny_model
from tailflow.driver.workers import rollout_resources, trainer_kwargs


def test_a_gpu_config_is_accepted_and_computes_on_cuda_unless_the_stand_in_is_set(monkeypatch):
    config = load_config(None, ["cluster.device=gpu", "rollout.engine=vllm"])
    assert config.cluster.device == "gpu" and config.rollout.engine == "vllm"
    monkeypatch.delenv(CUDA_STAND_IN, raising=False)
    assert torch_device("gpu") == "cuda" and torch_device("cpu") == "cpu"
    assert trainer_kwargs(config)["backend"] == "nccl"
    monkeypatch.setenv(CUDA_STAND_IN, "cpu")
    assert torch_device("gpu") == "cpu" and trainer_kwargs(config)["backend"] == "gloo"
    monkeypatch.setenv(CUDA_STAND_IN, "mps")
    with pytest.raises(ConfigError, match=f"{CUDA_STAND_IN}='mps': only 'cpu'"):
        torch_device("gpu")


def test_phases_take_turns_only_colocated_on_gpus_with_a_synchronous_unstreamed_step():
    gpu = ["cluster.device=gpu"]
    assert takes_turns(load_config(None, gpu))
    assert not takes_turns(load_config(None, []))  # CPUs: nothing to hand over
    assert not takes_turns(load_config(None, [*gpu, "cluster.placement=disaggregated"]))
    assert not takes_turns(load_config(None, [*gpu, "rollout.async_ratio=1", "train.loss=tis"]))
    assert not takes_turns(load_config(None, [*gpu, "train.stream=true", "reward.streaming=true"]))


def test_workers_added_at_runtime_on_gpus_ask_for_a_whole_gpu():
    assert rollout_resources(load_config(None, ["cluster.device=gpu"])) == {"num_cpus": 1, "num_gpus": 1}
    assert rollout_resources(load_config(None, [])) == {"num_cpus": 0.5, "num_gpus": 0}


@pytest.mark.e2e
def test_on_logical_gpus_actors_sit_where_the_layout_says_and_the_phases_take_turns(tmp_path):
    """Costs ~40 s here alone, ~80 s in the parallel suite (a Ray of its own with 2 logical GPUs, 2 trainer ranks,
    2 critic ranks and 2 rollout workers placed, a step's phases taking turns): placement is only seen on a real Ray."""
    write_random_tiny_model(tmp_path, seed=1)
    scenario = Path(__file__).with_name("gpu_wiring_scenario.py")
    run = subprocess.run([sys.executable, str(scenario), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])

    assert seen["takes_turns"] and seen["gpus_before"] == 2.0 and seen["gpus_reserved"] == 0.0
    trainer, rollout = seen["trainer_gpus"], seen["rollout_gpus"]
    assert all(len(gpus) == 1 for gpus in trainer + rollout)
    assert trainer[0] != trainer[1]  # one GPU per trainer rank
    assert rollout == trainer == seen["critic_gpus"]  # colocated: worker i and critic rank i share rank i's GPU
    assert seen["master_addr"] == seen["rank0_node_ip"]
    assert seen["devices"] == "cpu"  # the stand-in: Ray's GPUs are logical here

    assert seen["offloaded_at_start"] == [True, True]
    assert seen["engines_during_step"] == [[True, 0], [True, 0]]  # asleep while the trainer trains
    assert seen["trainer_offloaded_after_step"] == [False, False]  # the step brought the trainer back
    assert seen["trainer_offloaded_after_sync"] == [True, True]  # parked before the engines woke
    assert seen["critic_offloaded_at_start"] == [True, True] and seen["critic_values_after_offload"] == 8
    assert seen["critic_offloaded_after_step"] == [False, False]  # valuing brought it back
    assert seen["critic_offloaded_after_sync"] == [True, True]  # it left the GPU with the trainer
    assert seen["engines_after_sync"] == [[False, 1], [False, 1]]
    assert seen["trainer_offloaded_after_checkpoint"] == [True, True]  # the commit reads the parked copy
    assert seen["engine_weights_equal_parked"] and seen["optimizer_parked"]
    assert seen["versions"] == [1]

    assert seen["added_worker"] == 2 and seen["added_gpu"] == trainer[1]  # worker 1's seat went to worker 2
    assert seen["groups_after"] == ["REMOVED"]
    assert seen["evaluate_seats"] == [0, 2] and seen["evaluate_gpus_reserved"] == 0.0  # two workers, two GPUs
