"""The code reward: run the response's program against the problem's tests, in the sandbox.

Each execution is the harness below wrapped around the response's code:

- asserts and pytest-style test functions (KodCode) share one execution: the
  program is loaded as module `solution` (so `from solution import f`
  works), then every test runs in turn and reports pass or fail. When the
  execution ends inside a test (it hung into the timeout, hit a limit, or
  exited the process), that test fails and a fresh execution runs the tests
  after it, so one hanging test costs one timeout, not the others' results
  (a response whose every test hangs costs one timeout per test). A program
  that hangs or dies while loading fails every test in one execution;
- each stdin/stdout case (APPS) is its own execution: the program runs as
  `__main__` on the case's stdin and passes when it exits 0 and its stdout
  matches (line by line, trailing whitespace ignored).

Forgery. The harness reports on stderr, each line prefixed with a random
nonce that only the harness reads (byte by byte from stdin, before the
program runs, so the program's own stdin is untouched). A program that
prints "pass" lines, or exits 0 before the tests run, scores nothing. A
program that digs the nonce out of the harness's stack frame could still
forge a pass: the nonce stops accidents and simple reward hacks, not a
determined adversary.

Timing. `RewardResult.exec_s` is the longest execution of the response as
the harness measured it around the program and its tests (interpreter and
sandbox start-up excluded); where the harness could not report (killed,
os._exit) it is the sandbox's wall time, start-up included.
"""
from __future__ import annotations

import math
import re
import secrets
from dataclasses import dataclass

from tailflow.engines.data.problem import CodeTests, IOCase, Problem
from tailflow.engines.reward.math import RewardResult
from tailflow.engines.reward.sandbox import SandboxLimits, SandboxResult, resolve_backend, run_python

FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)

HARNESS = r'''
def _tailflow_harness(spec):
    import os, sys, time, traceback, types
    nonce = b""
    while not nonce.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            break
        nonce += byte
    nonce = nonce.decode().strip()
    err = sys.stderr
    def mark(*parts):
        err.write("\n" + nonce + " " + " ".join(str(part) for part in parts) + "\n")
        err.flush()
    started = time.perf_counter()
    if spec["mode"] == "io":
        namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        try:
            exec(compile(spec["code"], "main.py", "exec"), namespace)
        finally:
            mark("time", time.perf_counter() - started)
        return
    solution = types.ModuleType("solution")
    sys.modules["solution"] = solution
    try:
        exec(compile(spec["code"], "solution.py", "exec"), solution.__dict__)
        tests = {"__name__": "tests", "__builtins__": __builtins__}
        if spec["module"]:
            exec(compile(spec["module"], "test_solution.py", "exec"), tests)
    except BaseException:
        traceback.print_exc()
        mark("time", time.perf_counter() - started)
        mark("done")
        return
    mark("loaded")
    checks = [(statement, None) for statement in spec["asserts"]] + [(None, name) for name in spec["functions"]]
    for index in range(spec["start"], len(checks)):
        statement, name = checks[index]
        try:
            if name is None:
                exec(compile(statement, "assert_%d" % index, "exec"), solution.__dict__)
            else:
                tests[name]()
            mark("pass", index)
        except BaseException:
            traceback.print_exc()
            mark("fail", index)
    mark("time", time.perf_counter() - started)
    mark("done")


_tailflow_harness(SPEC)
'''


def extract_program(response_text: str) -> tuple[str, bool]:
    """(program, whether it came from a fenced block): the last ```python block, else the last ``` block,
    else the whole response."""
    blocks = FENCE.findall(response_text)
    python_blocks = [body for language, body in blocks if language.lower() in ("python", "py", "python3")]
    if python_blocks:
        return python_blocks[-1], True
    if blocks:
        return blocks[-1][1], True
    return response_text, False


def harness_program(code: str, mode: str, tests: CodeTests | None = None, start: int = 0) -> str:
    """The program that runs `code` under the harness: `io` runs it as `__main__`; `tests` runs the asserts and
    test functions (one index space, asserts first) from index `start` on."""
    spec = {"mode": mode, "code": code, "asserts": list(tests.asserts) if tests else [], "start": start,
            "module": tests.test_module if tests else "", "functions": list(tests.test_functions) if tests else []}
    return HARNESS.replace("SPEC", repr(spec))


def same_output(actual: str, expected: str) -> bool:
    """Line by line, trailing whitespace and trailing blank lines ignored."""
    def lines(text: str) -> list[str]:
        stripped = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
        while stripped and not stripped[-1]:
            stripped.pop()
        return stripped
    return lines(actual) == lines(expected)


@dataclass(frozen=True)
class HarnessReport:
    """What the harness said (only lines carrying the nonce count): tests passed and failed by index, whether
    the program loaded and the harness got to its end, and the seconds it measured (None if it never did)."""

    passed: frozenset[int] = frozenset()
    failed: frozenset[int] = frozenset()
    is_loaded: bool = False
    is_done: bool = False
    seconds: float | None = None


def read_report(result: SandboxResult, nonce: str) -> HarnessReport:
    marks: dict[str, set[int]] = {"pass": set(), "fail": set()}
    flags, seconds = set(), None
    prefix = nonce + " "
    for line in result.stderr.splitlines():
        if not line.startswith(prefix):
            continue
        kind, _, value = line[len(prefix):].partition(" ")
        if kind in marks:
            marks[kind].add(int(value))
        elif kind == "time":
            seconds = float(value)
        else:
            flags.add(kind)
    return HarnessReport(frozenset(marks["pass"]), frozenset(marks["fail"]), "loaded" in flags, "done" in flags,
                         seconds)


class CodeReward:
    def __init__(self, all_or_nothing: bool = False, backend: str = "auto", memory_mb: int = 1024,
                 max_processes: int = 32, timeout_max_s: float = 30.0, max_output_bytes: int = 1 << 20) -> None:
        if timeout_max_s <= 0:
            raise ValueError(f"reward.timeout_max_s must be > 0, got {timeout_max_s}")
        self.all_or_nothing = all_or_nothing
        self.sandbox = backend
        """The configured backend (`reward.sandbox`); `backend` is what it means in this process."""
        self.backend = resolve_backend(backend)
        self.memory_bytes = memory_mb << 20
        self.max_processes = max_processes
        self.timeout_max_s = timeout_max_s
        self.max_output_bytes = max_output_bytes
        self.num_executions = 0

    def limits(self, timeout_s: float) -> SandboxLimits:
        return SandboxLimits(timeout_s=timeout_s, cpu_time_s=max(1, math.ceil(timeout_s)) + 1,
                             memory_bytes=self.memory_bytes, max_processes=self.max_processes,
                             max_output_bytes=self.max_output_bytes)

    def execute(self, program: str, stdin: str, timeout_s: float) -> tuple[SandboxResult, HarnessReport]:
        nonce = secrets.token_hex(16)
        result = run_python(program, f"{nonce}\n{stdin}", self.limits(timeout_s), self.backend)
        self.num_executions += 1
        return result, read_report(result, nonce)

    def score_problem(self, response_text: str, problem: Problem, timeout_s: float | None = None) -> RewardResult:
        tests = problem.tests
        if tests is None or tests.num_tests == 0:
            raise ValueError(f"problem {problem.problem_id!r} has no code tests: reward.type 'code' needs them")
        timeout_s = self.timeout_max_s if timeout_s is None else timeout_s
        code, fenced = extract_program(response_text)
        passed, timeouts, slowest = 0, 0, None

        def account(result: SandboxResult, report: HarnessReport) -> None:
            nonlocal timeouts, slowest
            timeouts += result.status == "timeout"
            seconds = report.seconds if report.seconds is not None else result.duration_s
            slowest = seconds if slowest is None else max(slowest, seconds)

        num_checks, start = len(tests.asserts) + len(tests.test_functions), 0
        while start < num_checks:
            result, report = self.execute(harness_program(code, "tests", tests, start), "", timeout_s)
            account(result, report)
            passed += len(report.passed)
            if report.is_done or not report.is_loaded:
                break
            # It stopped inside a test (hung, killed, exited): that test fails, the rest get a fresh run.
            start += len(report.passed) + len(report.failed) + 1
        for case in tests.io_cases:
            result, report = self.execute(harness_program(code, "io"), case.stdin, timeout_s)
            account(result, report)
            passed += result.status == "ok" and same_output(result.stdout, case.expected_stdout)
        fraction = passed / tests.num_tests
        correct = passed == tests.num_tests
        reward = float(correct) if self.all_or_nothing else fraction
        return RewardResult(reward=reward, correct=correct, formatted=fenced, timeouts=timeouts, exec_s=slowest)

    def close(self) -> None:
        """Nothing to release: every execution's sandbox is gone when `score_problem` returns."""

    def __setstate__(self, state: dict) -> None:
        """Unpickled on another machine (a Ray worker), `auto` means what it means there."""
        self.__dict__.update(state, backend=resolve_backend(state["sandbox"]))


__all__ = ["CodeReward", "IOCase", "extract_program", "same_output"]
