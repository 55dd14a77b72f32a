"""The code reward: the fraction of a problem's tests that the response's program passes.

Asserts and test functions run in the test runner (`verdict.py`, a process
of its own that calls into the sandboxed program and gets plain data back);
each stdin/stdout case is a sandboxed run of the program whose output is
compared here (`same_output`). Either way the program never holds a test, an
expected value, the verdict or the clock (docs/rewards.md: "How tests run",
and the threat model).

Time. Each test, and loading the program, gets the timeout `timeout_s` (the
adaptive one); the response's budget (`reward.code_budget_s`) bounds all of
its tests together, from the moment scoring starts (extracting the program
included), and once it is spent the remaining tests fail unrun: one response
costs at most `budget_s + RUNNER_SLACK_S` seconds (docs/rewards.md, "The cost
of one answer"). `RewardResult.exec_s`, the adaptive timeout's anchor, is
the slowest unit (one test, the load, or one stdin/stdout run) measured
outside the sandbox.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

from tailflow.engines.data.problem import CodeTests, Problem
from tailflow.engines.reward.code.extract import extract_program, same_output
from tailflow.engines.reward.code.runner import run_verdict
from tailflow.engines.reward.code.verdict import TestsSpec
from tailflow.engines.reward.result import RewardResult
from tailflow.engines.reward.sandbox import SandboxLimits, cgroup, resolve_backend, run_python


@dataclass
class Tally:
    """One response's running count: tests passed, runs that hit the timeout, the slowest unit."""

    passed: int = 0
    timeouts: int = 0
    slowest_s: float | None = None

    def add_time(self, seconds: float | None) -> None:
        if seconds is not None:
            self.slowest_s = seconds if self.slowest_s is None else max(self.slowest_s, seconds)


class CodeReward:
    def __init__(self, all_or_nothing: bool = False, backend: str = "auto", memory_mb: int = 1024,
                 max_processes: int = 32, timeout_max_s: float = 30.0, budget_s: float = 60.0) -> None:
        if timeout_max_s <= 0:
            raise ValueError(f"reward.timeout_max_s must be > 0, got {timeout_max_s}")
        if budget_s <= 0:
            raise ValueError(f"reward.code_budget_s must be > 0, got {budget_s}")
        self.all_or_nothing = all_or_nothing
        self.sandbox = backend
        """The configured backend (`reward.sandbox`); `backend` is what it means in this process."""
        self.backend = resolve_backend(backend)
        self.memory_bytes = memory_mb << 20
        self.max_processes = max_processes
        self.timeout_max_s = timeout_max_s
        self.budget_s = budget_s
        cgroup.remove_owned_by(None)  # sandbox cgroups of earlier processes that were killed
        self.num_executions = 0
        """Sandboxes started, over this object's life (a hang inside a test costs one more)."""

    def limits(self, timeout_s: float) -> SandboxLimits:
        return SandboxLimits(timeout_s=timeout_s, cpu_time_s=max(1, math.ceil(timeout_s)) + 1,
                             memory_bytes=self.memory_bytes, max_processes=self.max_processes)

    def score_problem(self, response_text: str, problem: Problem, timeout_s: float | None = None) -> RewardResult:
        tests = problem.tests
        if tests is None or tests.num_tests == 0:
            raise ValueError(f"problem {problem.problem_id!r} has no code tests: reward.type 'code' needs them")
        deadline = time.monotonic() + self.budget_s  # the budget covers everything from here
        timeout_s = self.timeout_max_s if timeout_s is None else timeout_s
        code, fenced = extract_program(response_text)
        tally = Tally()
        if tests.asserts or tests.test_functions:
            self.run_test_code(code, tests, timeout_s, deadline, tally)
        for case in tests.io_cases:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            result = run_python(code, case.stdin, self.limits(min(timeout_s, left)), self.backend)
            self.num_executions += 1
            tally.timeouts += result.status == "timeout"
            tally.add_time(result.duration_s)
            tally.passed += result.status == "ok" and same_output(result.stdout, case.expected_stdout)
        correct = tally.passed == tests.num_tests
        reward = float(correct) if self.all_or_nothing else tally.passed / tests.num_tests
        return RewardResult(reward=reward, correct=correct, formatted=fenced, timeouts=tally.timeouts,
                            exec_s=tally.slowest_s)

    def run_test_code(self, code: str, tests: CodeTests, timeout_s: float, deadline: float, tally: Tally) -> None:
        """The asserts and test functions, in the test-runner process; only real test indexes count."""
        budget_s = deadline - time.monotonic()
        if budget_s <= 0:
            return
        limits = {name: value for name, value in asdict(self.limits(budget_s)).items() if name != "timeout_s"}
        spec = TestsSpec(code, list(tests.asserts), tests.test_module, list(tests.test_functions), timeout_s,
                         budget_s, self.backend, limits)
        verdict = run_verdict(spec)
        self.num_executions += verdict.sessions
        tally.passed += len(set(verdict.passed) & set(range(spec.num_tests)))
        tally.timeouts += verdict.timeouts
        tally.add_time(verdict.slowest_s)

    def __setstate__(self, state: dict) -> None:
        """Unpickled on another machine (a Ray worker), `auto` means what it means there."""
        self.__dict__.update(state, backend=resolve_backend(state["sandbox"]))
