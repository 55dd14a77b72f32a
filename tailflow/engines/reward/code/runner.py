"""Starting the test runner (`verdict.py`) as a process of its own, within bounds the caller sets.

Time: it is killed at its budget plus `RUNNER_SLACK_S` (then nothing passed).
Memory: it limits its own address space to `RUNNER_MEMORY_BYTES` first thing
(`--memory-bytes`; no preexec_fn: the caller may have threads), so test code that a returned value sends into building
something huge gets a MemoryError in that test, not the host's memory.
Output: at most `RUNNER_OUTPUT_BYTES` of its stdout (the verdict) and stderr
are read. Its string hashes are its own (`PYTHONHASHSEED` is not passed on).
The sandboxes it started die with it (bubblewrap's --die-with-parent, the
jail's parent-death signal); their cgroups, which a killed runner cannot
remove, are removed here.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
from dataclasses import asdict

from tailflow.engines.reward.code.verdict import TestsSpec, TestVerdict
from tailflow.engines.reward.sandbox import cgroup
from tailflow.engines.reward.sandbox.process import kill_everything, supervised
from tailflow.engines.reward.sandbox.records import Launched

RUNNER_SLACK_S = 10.0
"""Past the budget, how long the test runner may take to start and report before it is killed."""
RUNNER_MEMORY_BYTES = 1 << 30
"""The test runner's own address-space limit."""
RUNNER_OUTPUT_BYTES = 1 << 20
log = logging.getLogger(__name__)


def run_verdict(spec: TestsSpec) -> TestVerdict:
    """Run the test runner as a process; killed at the budget plus slack (then nothing passed)."""
    command = [sys.executable, "-m", "tailflow.engines.reward.code.verdict", "--memory-bytes", str(RUNNER_MEMORY_BYTES)]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONHASHSEED"}
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, start_new_session=True)
    launched = Launched(proc, functools.partial(kill_everything, proc, False), ())
    try:
        outcome = supervised(launched, json.dumps(asdict(spec)).encode(), spec.budget_s + RUNNER_SLACK_S,
                             RUNNER_OUTPUT_BYTES)
    finally:
        cgroup.remove_owned_by(proc.pid)
    if outcome.timed_out:
        return TestVerdict([], 1, spec.budget_s, spec.budget_s, 1)
    try:
        return TestVerdict(**json.loads(outcome.stdout))
    except (ValueError, TypeError):
        log.warning("code reward: the test runner failed (exit %s): %s", outcome.returncode,
                    outcome.stderr[-2000:].decode(errors="replace"))
        return TestVerdict([], 0, None, spec.budget_s, 1)
