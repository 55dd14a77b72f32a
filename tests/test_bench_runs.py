"""The benchmarks that run tailflow end to end (several real runs each), on tiny settings (`--quick`): tail
batching against its baseline, the asynchronous step, and the tailflow side of the TRL peer. The same rules as
tests/test_bench_smoke.py (whose `run_bench` they use); a file of their own so that xdist runs them beside the
other benchmark smokes instead of after them on the same worker.
"""
from __future__ import annotations

import re

import pytest

from quick_bench import run_bench

pytestmark = pytest.mark.slow


@pytest.mark.bench
def test_tail_batching_quick(cli_env):
    """Costs ~100 s here (bench/tail_batching.py --quick as its own process: four tailflow runs, baseline, tail,
    tail with R = R0 and tail.continue_deferred, each starting Ray, its actors, one trainer rank and a Prefect flow).
    It cannot be cheaper: the speedup, the emptied queue and the continuing rule's waste are claims about whole runs
    compared side by side, and the quick run is already 3 iterations, the fewest that end on the long round."""
    stdout = run_bench("tail_batching.py", timeout=900, env=cli_env)  # baseline, tail, R = R0, continuing
    last_line = stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"RESULT step_total_speedup=\S+ short_generate_speedup=\S+ accuracy_delta=\S+ queue_left=0 "
                         r"unbiased_step_total_speedup=\S+ unbiased_accuracy_delta=\S+ "
                         r"tail_wasted_fraction=(\S+) continue_wasted_fraction=(\S+) continue_step_ratio=\S+ "
                         r"continue_accuracy_delta=\S+ tail_length_ratio=\S+ continue_length_ratio=\S+",
                         last_line)  # whole queue cycles: no deferred prompt left unpaid
    assert match, last_line
    # counted, not timed: continuing a deferred prompt's first draws discards fewer of the tokens generated
    assert float(match[2]) < float(match[1]), last_line
    assert "VERDICT (continuing):" in stdout and "continued responses (sum tail/continued_responses)" in stdout
    assert "VERDICT:" in stdout and "length profile" in stdout and "tokens/s" in stdout
    assert "length bias, means over the" in stdout and "tail/launched_length_mean" in stdout
    assert "queue left at the end of the tail run: 0 prompts" in stdout


@pytest.mark.bench
def test_async_quick(cli_env):
    """Two settings (~2 min): the synchronous step and alpha = 1, through the whole report to the RESULT line."""
    stdout = run_bench("async.py", "--settings", "sync,async1", timeout=600, env=cli_env)
    last_line = stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"RESULT skip_stream_step_speedup=\S+ async_step_speedup=\d+\.\d\d "
                         r"sim_async_speedup_32b=(\d+\.\d\d) accuracy_delta=\d+\.\d", last_line)
    assert match, last_line
    assert float(match[1]) > 1.0  # simulated on a virtual clock: asynchrony predicted to pay at 32B
    assert "CPU per phase" in stdout and "async1" in stdout and "SIMULATED, not measured" in stdout


@pytest.mark.bench
def test_peer_tailflow_side_quick(cli_env):
    """The tailflow half of bench/peer.py (the synchronous and the default run, 2 steps each); the TRL half needs
    its own venv (scripts/peer_env.sh) and runs only in the full benchmark. tests/test_peer_bench.py checks what
    TRL would be handed.
    Costs ~117 s here (two tailflow runs of 2 steps each, each starting Ray, its actors and a Prefect flow, plus a
    held-out eval of 16 problems): the prompt-order check needs the synchronous run to really train, and the default
    run is what the comparison is about."""
    stdout = run_bench("peer.py", "--tailflow-only", timeout=900, env=cli_env)
    assert "prompt order: tailflow sync trained exactly the prompts handed to TRL, in order: yes" in stdout
    assert "tailflow sync" in stdout and "tailflow default" in stdout and "final held-out accuracy" in stdout
    assert stdout.strip().splitlines()[-1] == "TRL side skipped (--tailflow-only): no RESULT line"


@pytest.mark.bench
def test_agentic_quick(cli_env):
    """bench/agentic.py's paths: environment-level async with injected latency, and the faulty run with redundant
    rollout (fail-slow and fail-stop environments, tail batching over trajectories), 2 iterations of 4 tasks x 4
    trajectories each, through the table to the RESULT line. Costs ~1.5 min here (two tailflow runs, each starting
    Ray, the rollout, trainer, reward and environment actors and a Prefect flow); turn_sync and lockstep are left
    to the full bench (their schedules are tested in tests/test_trajectory_engine.py)."""
    stdout = run_bench("agentic.py", "--settings", "async,faulty+redundant", timeout=900, env=cli_env)
    last_line = stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"RESULT env_async_speedup=nan redundant_step_ratio=(\d+\.\d{3}) unguarded_step_ratio=nan "
                         r"accuracy_delta=nan", last_line)
    assert match, last_line
    assert float(match[1]) > 0
    assert "faulty+redundant" in stdout and "verdict:" in stdout and "traj/s" in stdout
