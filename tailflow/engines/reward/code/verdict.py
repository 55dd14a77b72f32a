"""The test runner: holds the tests, calls into the sandboxed program, and alone decides pass or fail.

Run as its own short-lived process (`python -m tailflow.engines.reward.code.verdict`,
a `TestsSpec` as JSON on stdin, a `TestVerdict` as JSON on stdout), outside
the program's sandbox: the program can neither see the tests and expected
values nor reach this process, its clock, or its verdict. Being a process of
its own also bounds trusted test code that a returned value sends into a
long loop (the caller kills it at the response's time budget) or into using
memory (the caller gives it an address-space limit of its own). The verdict
has the original stdout to itself: fd 1 is /dev/null before any test runs, so
a test that prints cannot garble it.

One index space: asserts first, then test functions; which passes count is
`passes.py`'s rule (a test passed only by the program raising counts only
beside one it passed by answering). Each test (and loading
the program, and the test module's top level) gets the timeout; the
response's budget bounds all of them together, and once it is spent the
remaining tests fail unrun. A test during which the program stopped
answering fails whatever the test code did about it, and the next test gets
a fresh sandbox. If loading the program raises or hangs, every test fails.
Times are this process's monotonic clock around each test.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tailflow.engines.reward.code.names import exposed_names, test_namespace
from tailflow.engines.reward.code.passes import CallOutcomes, TestRecord, counted_passes
from tailflow.engines.reward.code.remote import RemoteProgram, SessionLost
from tailflow.engines.reward.code.testcalls import run_test
from tailflow.engines.reward.sandbox.records import SandboxLimits
from tailflow.engines.reward.sandbox.session import SandboxSession

SERVED_SOURCE = "\n".join(Path(__file__).with_name(name).read_text() for name in ("wire.py", "serve.py"))
"""What runs in the sandbox besides the program: the wire format and the request loop."""


@dataclass(frozen=True)
class TestsSpec:
    """What the runner needs: the program, its tests, and the time it may spend."""

    program: str
    asserts: list[str]
    test_module: str
    test_functions: list[str]
    timeout_s: float
    """Each test's own limit (and loading the program's)."""
    budget_s: float
    """All of this response's tests together (`reward.code_budget_s`)."""
    backend: str
    limits: dict = field(default_factory=dict)
    """`SandboxLimits` fields other than the timeout."""

    @property
    def num_tests(self) -> int:
        return len(self.asserts) + len(self.test_functions)


@dataclass(frozen=True)
class TestVerdict:
    """Indexes of the passed tests that count (`passes.py`), how many ran out of time, the slowest unit (load or
    one test) and the whole time spent, by the runner's clock; `sessions` counts the sandboxes started."""

    passed: list[int]
    timeouts: int
    slowest_s: float | None
    spent_s: float
    sessions: int


class TestTimeout(BaseException):
    """The trusted side's own alarm: a unit outlived its time (even in test code that never calls out)."""


def on_alarm(signum, frame) -> None:
    raise TestTimeout()


@dataclass
class Unit:
    """The outcome of one timed unit: its seconds and whether it ended by the clock."""

    seconds: float = 0.0
    is_timeout: bool = False
    error: BaseException | None = None


def timed(action, program: RemoteProgram, limit_s: float) -> Unit:
    """Run `action()` with every request and the whole unit bounded by `limit_s` seconds."""
    started = time.monotonic()
    program.deadline = started + limit_s
    unit = Unit()
    signal.setitimer(signal.ITIMER_REAL, max(limit_s, 1e-3) + 0.05)
    try:
        action()
    except TestTimeout as error:
        unit.is_timeout, unit.error = True, error
    except SessionLost as error:
        unit.is_timeout, unit.error = error.reason == "timeout", error
    except BaseException as error:  # noqa: BLE001 - a failing test may raise anything
        unit.error = error
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    unit.seconds = time.monotonic() - started
    if unit.is_timeout and program.lost is None:  # the alarm may have struck mid-exchange
        program.lost = "timeout"
        program.session.close()
    return unit


class Runner:
    def __init__(self, spec: TestsSpec) -> None:
        """Raises SyntaxError when the tests themselves do not compile (then nothing passes)."""
        self.spec = spec
        self.module_code = compile(spec.test_module, "test_solution.py", "exec") if spec.test_module else None
        self.assert_codes = [compile(text, f"assert_{index}", "exec") for index, text in enumerate(spec.asserts)]
        self.exposed = exposed_names([*self.assert_codes, *([self.module_code] if self.module_code else [])])
        self.limits = SandboxLimits(timeout_s=spec.budget_s + 1, **spec.limits)
        self.started = time.monotonic()
        self.records: list[TestRecord] = []
        self.timeouts = 0
        self.slowest: float | None = None
        self.sessions = 0

    def left_s(self) -> float:
        return self.spec.budget_s - (time.monotonic() - self.started)

    def count(self, unit: Unit) -> None:
        self.timeouts += unit.is_timeout
        self.slowest = unit.seconds if self.slowest is None else max(self.slowest, unit.seconds)

    def start(self) -> tuple[RemoteProgram, dict] | None:
        """A fresh sandbox with the program loaded and the test module run; None if that failed."""
        self.sessions += 1
        served = f"{SERVED_SOURCE}\nserve_forever({self.spec.program!r})\n"
        program = RemoteProgram(SandboxSession(served, self.limits, self.spec.backend))
        namespace: dict = {}

        def load() -> None:
            namespace.update(test_namespace(program.load(), self.exposed))
            if self.module_code is not None:
                exec(self.module_code, namespace)

        unit = timed(load, program, min(self.spec.timeout_s, self.left_s()))
        self.count(unit)
        if unit.error is not None:
            program.session.close()
            return None
        return program, namespace

    def run_one(self, index: int, program: RemoteProgram, namespace: dict) -> None:
        if index < len(self.assert_codes):
            code = self.assert_codes[index]
            action = lambda: exec(code, namespace)  # noqa: E731
        else:
            function = namespace.get(self.spec.test_functions[index - len(self.assert_codes)])
            action = lambda: run_test(function)  # noqa: E731
        program.outcomes = CallOutcomes()
        unit = timed(action, program, min(self.spec.timeout_s, self.left_s()))
        self.count(unit)
        outcomes = program.outcomes
        self.records.append(TestRecord(index, unit.error is None and program.lost is None, outcomes.raised > 0,
                                       outcomes.answered > 0))

    def run(self) -> TestVerdict:
        live = None
        for index in range(self.spec.num_tests):
            if self.left_s() <= 0:
                break
            if live is None:
                live = self.start()
                if live is None:
                    break
            self.run_one(index, *live)
            if live[0].lost is not None or live[0].session.is_closed:
                live = None
        if live is not None:
            live[0].session.close()
        return TestVerdict(counted_passes(self.records, self.spec.num_tests), self.timeouts, self.slowest,
                           time.monotonic() - self.started, self.sessions)


def run_tests(spec: TestsSpec) -> TestVerdict:
    """In this process (it sets SIGALRM: call it from a process's main thread, as `main` does)."""
    started = time.monotonic()
    try:
        runner = Runner(spec)
    except (SyntaxError, ValueError):  # tests that do not compile: nothing can pass
        return TestVerdict([], 0, None, time.monotonic() - started, 0)
    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        return runner.run()
    finally:
        signal.signal(signal.SIGALRM, previous)


def private_stdout():
    """The verdict's channel: the original stdout, kept; fd 1 and `sys.stdout` then go to /dev/null, so whatever
    the tests print never reaches the caller's reading of the verdict."""
    channel = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stdout = open(os.devnull, "w")
    return channel


def main() -> int:
    """`--memory-bytes N`: this process's own address-space limit (set by `runner.py`'s caller)."""
    if len(sys.argv) == 3 and sys.argv[1] == "--memory-bytes":
        resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))
    channel = private_stdout()
    spec = TestsSpec(**json.loads(sys.stdin.read()))
    verdict = run_tests(spec)
    channel.write(json.dumps(asdict(verdict)))
    channel.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
