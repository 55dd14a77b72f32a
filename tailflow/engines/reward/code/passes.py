"""Which passed tests count: a test passed only by the program raising counts only beside one it passed by answering.

A program that raises the exception a `pytest.raises` test expects, on every
call, passes every such test without solving anything. So the runner notes,
per test, what the program did when the test called into it (`CallOutcomes`:
a call, an await or a generator's next item that raised; a request answered
with plain data), and:

- a passed test during which the program raised and answered nothing with a
  value is *raise-only*;
- raise-only passes count only when the same response also passes a test
  during which the program answered with a value and raised nothing, or
  passes every test.

A test that expects both a value and an exception (`assert f(1) == 1` then
`pytest.raises` around `f(-1)`) counts on its own. Objects that are not plain
data (the `Stack()` a test builds) are not values: a `Stack` whose every method
raises passes raise-only tests only. Passing every test unlocks them because
then nothing tells the program from a right one: a problem whose every test
expects an exception cannot, and raising everywhere is all its tests ask.
docs/rewards.md, "Tests that expect an exception".
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CallOutcomes:
    """What the program did in one test's calls into it (reset by the runner before each test)."""

    raised: int = 0
    """Calls, awaits and next items that raised."""
    answered: int = 0
    """Requests answered with plain data (no object of the program's in it)."""


@dataclass(frozen=True)
class TestRecord:
    index: int
    passed: bool
    raised: bool
    answered: bool

    @property
    def is_raise_only(self) -> bool:
        return self.raised and not self.answered

    @property
    def is_clean(self) -> bool:
        return self.answered and not self.raised


def counted_passes(records: list[TestRecord], num_tests: int) -> list[int]:
    """Indexes of the passed tests that count, by the rule above; `num_tests`: all the tests, run or not."""
    passed = [record for record in records if record.passed]
    unlocked = len(passed) == num_tests or any(record.is_clean for record in passed)
    return sorted(record.index for record in passed if unlocked or not record.is_raise_only)
