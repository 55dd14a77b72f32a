"""Environments that misbehave on cue, for tests/test_env_host.py and tests/test_env_worker.py.

They run in environment processes, which import them by class path (`env_cases:Scripted`): tests/ is on those
processes' sys.path (pytest's, or the PYTHONPATH the test's Ray is started with).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tailflow.engines.env.environment import EnvStep, Environment, InvalidAction


class Scripted(Environment):
    """The action says what happens: `boom` raises, `hang` never answers, `bad` is invalid, `long` answers 100
    bytes, `slow:<s>` answers after s seconds (logging its start and end to `log_dir`), `done` ends the task with
    reward 1, `wrong_type` returns a str instead of an EnvStep; anything else is echoed with ".". With `fail_resets`
    > 0 the first that many resets (counted in files under `log_dir`, across processes) raise; every reset takes
    `slow_reset_s` at least."""

    def __init__(self, log_dir: str = "", fail_resets: int = 0, hang_resets: bool = False,
                 slow_reset_s: float = 0.0) -> None:
        self.log_dir, self.fail_resets, self.hang_resets = log_dir, fail_resets, hang_resets
        self.slow_reset_s = slow_reset_s

    def reset(self, seed: int) -> str:
        if self.log_dir:
            attempts = Path(self.log_dir) / "reset_attempts"
            with open(attempts, "a") as log:
                log.write(f"{time.monotonic()}\n")
            if len(attempts.read_text().split()) <= self.fail_resets:
                raise ConnectionError("the backend is not up yet")
        if self.hang_resets:
            time.sleep(3600)
        time.sleep(self.slow_reset_s)
        return f"{seed}\n"

    def step(self, action: str) -> EnvStep:
        if action == "boom":
            raise RuntimeError("the environment broke")
        if action == "hang":
            time.sleep(3600)
        if action == "bad":
            raise InvalidAction("not a move")
        if action == "long":
            return EnvStep("7" * 100)
        if action == "done":
            return EnvStep("", reward=1.0, done=True)
        if action == "wrong_type":
            return "a string"  # type: ignore[return-value]
        if action.startswith("slow:"):
            started = time.monotonic()
            time.sleep(float(action[5:]))
            with open(Path(self.log_dir) / f"step-{os.getpid()}-{started}", "w") as log:
                json.dump([started, time.monotonic()], log)
        return EnvStep(action + ".")


def logged_steps(log_dir: str | Path) -> list[tuple[int, float, float]]:
    """(environment pid, start, end) of every logged `slow:` step (time.monotonic is one clock for the machine)."""
    steps = []
    for path in Path(log_dir).glob("step-*"):
        start, end = json.loads(path.read_text())
        steps.append((int(path.name.split("-")[1]), start, end))
    return steps


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak
