"""Durable runs that need a clean run of their own: rollout workers added at runtime kept through an iteration
restart and a resume, and a Megatron run SIGKILLed and resumed. Split from tests/test_durable_runs.py (which
compares against one shared clean run) so that xdist runs the two files on its two workers side by side.
"""
from __future__ import annotations

import signal

import pytest
import yaml

from durable_cli import outcome, run_cli, run_config
from tailflow.engines.runs.commit import read_committed_state
from tailflow.engines.store import LocalStore

pytestmark = pytest.mark.slow


@pytest.mark.long
def test_rollout_workers_added_at_runtime_survive_an_iteration_restart_and_a_resume(tmp_path, cli_env):
    """A run with one rollout worker is told to add one (`send_worker_command`, as `tailflow workers add`); a
    trainer death then restarts an iteration and a SIGKILL ends the run: the restart and the resume each start
    the added worker again, and every commit from then on records it.
    Costs ~221 s here (three CLI runs, each starting Ray, its actors and the Prefect flow; the second restarts an
    iteration after a trainer death before its SIGKILL). It cannot be cheaper: the added worker must outlive both an
    iteration restart and a new process, and the SIGKILL needs a process of its own."""
    from tailflow.engines.cluster.worker_control import WorkerCommand, send_worker_command

    config = run_config(tmp_path)
    config["train"].update(iterations=1, num_workers=1)
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(config))
    store = LocalStore(tmp_path)
    first = run_cli(["train", "-c", str(config_path), "--run-id", "grown"], cli_env)
    assert first.returncode == 0, first.stdout[-4000:]
    assert read_committed_state(store, "grown").rollout_workers_added == 0

    send_worker_command(store, "grown", WorkerCommand(add=1))  # taken at the next run's first poll
    more = ["resume", "grown", "--set", f"storage.uri={tmp_path}", "--set", "train.iterations=4",
            "--allow-change", "train.iterations"]
    second = run_cli(more, cli_env, fault="kill-trainer@2,crash-train@3")
    assert second.returncode == -signal.SIGKILL, second.stdout[-4000:]
    assert second.stdout.count("an actor died") == 1
    assert second.stdout.count("keeping the rollout workers added at runtime: 1 (rollout.num_workers) +1") == 1
    assert read_committed_state(store, "grown").iteration == 3
    assert read_committed_state(store, "grown").rollout_workers_added == 1

    third = run_cli(more, cli_env)
    assert third.returncode == 0, third.stdout[-4000:]
    assert "keeping the rollout workers added at runtime: 1 (rollout.num_workers) +1" in third.stdout
    state, rows = outcome(tmp_path, "grown")
    assert state.iteration == 4 and state.rollout_workers_added == 1
    assert len(rows) == 4


MEGATRON_HANG_S = 900
"""A Megatron run also imports megatron-core and builds its model in every trainer actor; on a loaded 2-core
machine (load ~25) its 3 iterations ran past 300 s without being stuck."""


def test_a_megatron_run_sigkilled_then_resumed_ends_bit_for_bit_where_its_clean_run_does(tmp_path, cli_env):
    """train.backend megatron (tensor parallel 2 on the two trainer actors, megatron-core's CPU stand-in), with a
    critic (train.advantage gae: two more Megatron ranks): a run SIGKILLed in iteration 2's train phase resumes
    from iteration 1's commit, every rank of policy and critic from its own checkpoint shard (parameters and AdamW
    state), and ends with the clean Megatron run's weights, queue and metrics rows (the critic's among them).
    Costs ~230 s here (three CLI runs, clean, SIGKILLed and resumed, each starting Ray, 6 or more actors with
    megatron-core and the Prefect flow): the clean run is its own (Megatron's, not the FSDP2 reference), the SIGKILL
    needs a process of its own, and two tensor-parallel ranks are what per-rank checkpoint shards need."""
    pytest.importorskip("megatron.core", reason="megatron-core (the `megatron` extra) is not installed")
    config = run_config(tmp_path)
    config["train"].update(backend="megatron", advantage="gae")
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(config))
    clean = run_cli(["train", "-c", str(config_path), "--run-id", "megatron-clean"], cli_env, hang_s=MEGATRON_HANG_S)
    assert clean.returncode == 0, clean.stdout[-4000:]
    killed = run_cli(["train", "-c", str(config_path), "--run-id", "megatron-killed"], cli_env, "crash-train@2",
                     MEGATRON_HANG_S)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:]
    store = LocalStore(tmp_path)
    state = read_committed_state(store, "megatron-killed")
    assert state.iteration == 2
    for model_dir in (tmp_path / state.latest_checkpoint, tmp_path / state.latest_checkpoint / "critic"):
        assert sorted(path.name for path in (model_dir / "megatron").iterdir()) == ["rank_00000.pt", "rank_00001.pt"]
    resumed = run_cli(["resume", "megatron-killed", "--set", f"storage.uri={tmp_path}"], cli_env,
                      hang_s=MEGATRON_HANG_S)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert "resuming after iteration 0001" in resumed.stdout

    expected_state, expected_rows = outcome(tmp_path, "megatron-clean")
    state, rows = outcome(tmp_path, "megatron-killed")
    assert expected_state.iteration == 3 and rows == expected_rows
    assert all(row["critic/grad_norm"] > 0 for row in rows)
    assert state.weights_sha256 == expected_state.weights_sha256 and state.tail == expected_state.tail
