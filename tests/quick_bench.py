"""Runs a benchmark script as a user does, on its tiny settings (`--quick`): tests/test_bench_smoke.py and
tests/test_bench_runs.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


def run_bench(script: str, *args: str, timeout: int = 600, env: dict | None = None) -> str:
    """Run bench/<script> --quick; its stdout, after checking it exited 0. The timeout only catches a hang: a
    quick bench takes 1-3 minutes on 2 idle cores, several times that on a loaded machine. `env`: the child's
    environment (the `cli_env` fixture's points its runs at the session's Prefect server, so a bench that runs
    flows does not start a server of its own); by default this process's, whose PREFECT_HOME is the session's
    temp home (conftest.py), so the child's ephemeral server is isolated too."""
    result = subprocess.run([sys.executable, str(BENCH_DIR / script), "--quick", *args], capture_output=True,
                            text=True, timeout=timeout, env=dict(os.environ) if env is None else env)
    output = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.returncode == 0, f"{script} exited {result.returncode}:\n{output}"
    return result.stdout
