"""What the durable-run tests share: the tiny seeded run, and `tailflow` as a killable child process.

Each run is `python -m tailflow.cli train` in its own session (process group),
so a kill takes the driver and whatever it started with it, as a lost node
would. The fault points are engines/faults.py's (TAILFLOW_FAULT).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tailflow.engines.runs.commit import read_committed_state
from tailflow.engines.store import LocalStore
from tailflow.engines.track.metrics import without_timing
from tailflow.driver.inputs import shipped_warmstart_dir


def run_config(storage) -> dict:
    """3 iterations, tail batching with a long round at iteration 2 (so the queue crosses commits),
    one rollout worker (bit-for-bit), two FSDP ranks (sharded optimizer state), one reward worker (the pool
    growing costs an actor start each and is tested in tests/test_reward_scheduler.py)."""
    return {
        "model": {"path": str(shipped_warmstart_dir())},
        "data": {"num_train": 64, "num_eval": 8, "prompts_per_step": 4},
        "rollout": {"n": 4, "max_new_tokens": 24, "num_slots": 16},
        "train": {"iterations": 3, "eval_every": 2, "num_workers": 2, "lr": 1e-3},
        "tail": {"enabled": True, "prompt_ratio": 1.5, "responses_launched": 5},
        "reward": {"max_workers": 1},
        "storage": {"uri": str(storage)},
    }


def run_cli(args: list[str], env: dict, fault: str | None = None, hang_s: int = 300) -> subprocess.CompletedProcess:
    """`tailflow <args>` in a process group of its own; killed and failed as hung after `hang_s`."""
    child_env = dict(env, **({"TAILFLOW_FAULT": fault} if fault else {}))
    process = subprocess.Popen([sys.executable, "-m", "tailflow.cli", *args], env=child_env, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=hang_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{' '.join(args)} (TAILFLOW_FAULT={fault}) hung for {hang_s} s:\n{output[-4000:]}")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # what the driver started dies with it
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(process.args, process.returncode, output, "")


def outcome(storage, run_id: str, ignore: tuple[str, ...] = ()):
    state = read_committed_state(LocalStore(storage), run_id)
    rows = [json.loads(line) for line in (storage / run_id / "metrics.jsonl").read_text().splitlines()]
    untimed = [{k: v for k, v in without_timing(row).items() if k not in ignore} for row in rows]
    return state, untimed
