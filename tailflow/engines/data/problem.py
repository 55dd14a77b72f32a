"""The record every dataset yields: one verifiable problem."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IOCase:
    """One stdin/stdout test (APPS style): the program reads `stdin`; its stdout must equal `expected_stdout`
    (compared line by line with trailing whitespace ignored)."""

    stdin: str
    expected_stdout: str


@dataclass(frozen=True)
class CodeTests:
    """How a code problem is checked.

    - `asserts`: statements the test runner runs outside the sandbox, on the program's names (one test each);
    - `test_module` + `test_functions`: a pytest-style module (KodCode's `test` field) that may
      `from solution import f`; each named `test_*` function is one test;
    - `io_cases`: stdin/stdout pairs (APPS style), one execution each.

    Asserts and test functions of one response share one execution. `reference_time_s` is how long
    a known-correct solution takes for one execution, when the dataset knows it: the adaptive
    timeout's first anchor for this problem.
    """

    asserts: tuple[str, ...] = ()
    io_cases: tuple[IOCase, ...] = ()
    test_module: str = ""
    test_functions: tuple[str, ...] = ()
    reference_time_s: float | None = None

    @property
    def num_tests(self) -> int:
        return len(self.asserts) + len(self.test_functions) + len(self.io_cases)


@dataclass(frozen=True)
class Problem:
    """One prompt with its checkable answer.

    `problem_id` is stable across runs (the long-prompt queue and resume refer
    to problems by it); `solution` is a reference response, used only by the
    warm-start SFT and absent for most real datasets. A code problem carries
    `tests` (its `answer` is then unused, conventionally "").
    """

    problem_id: str
    prompt: str
    answer: str
    solution: str | None = None
    tests: CodeTests | None = None
