"""bench/engine.py's vLLM numbers that run in processes of their own: the tail-batching step ratio with
rollout.engine=vllm, and the engine contract on vLLM.

Runs only where vLLM is importable (.venv-vllm, scripts/install_vllm.sh).
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def has_vllm() -> bool:
    return importlib.util.find_spec("vllm") is not None


def tail_step_speedup(quick: bool) -> float:
    """bench/tail_batching.py with rollout.engine=vllm: its step_total_speedup (baseline / tail batching). The R = R0
    run is left out (--without-r0: its fields are not read here); the tail.continue_deferred run stays, so vLLM
    continues deferred prompts' responses from their tokens in every such run (its verdict is printed, not read)."""
    command = [sys.executable, str(REPO / "bench" / "tail_batching.py"), "--engine", "vllm", "--without-r0",
               *(["--quick"] * quick)]
    print(f"tail batching with rollout.engine=vllm: {' '.join(command[1:])}", flush=True)
    result = subprocess.run(command, capture_output=True, text=True)
    tail = result.stdout.strip().splitlines()[-24:]
    print("\n".join(f"  | {line}" for line in tail))
    match = re.search(r"RESULT step_total_speedup=(\S+)", result.stdout)
    if result.returncode != 0 or match is None:
        raise RuntimeError(f"bench/tail_batching.py --engine vllm exited {result.returncode}:\n{result.stderr[-3000:]}")
    return float(match.group(1))


def contract_passed(quick: bool) -> tuple[int, int]:
    """The engine contract's vLLM class (tests/test_vllm_engine.py): (passed, run); --quick: Qwen2 only."""
    selection = "Contract and qwen2" if quick else "Contract"
    command = [sys.executable, "-m", "pytest", "--vllm-only", str(REPO / "tests" / "test_vllm_engine.py"), "-q",
               "-p", "no:cacheprovider", "-k", selection]
    print(f"engine contract on vLLM: pytest ... -k {selection!r}", flush=True)
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-2000:]
    print(f"  | {summary}")
    counts = {word: int(number) for number, word in re.findall(r"(\d+) (passed|failed|error|errors)", summary)}
    passed = counts.get("passed", 0)
    return passed, passed + counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
