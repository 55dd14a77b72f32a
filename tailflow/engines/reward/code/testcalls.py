"""How one test function runs, as pytest would run it: every parameter set, coroutines awaited, nothing else.

- `@pytest.mark.parametrize` (stacked ones multiply): the test passes when it
  passes for every parameter set; a set marked `skip`, `skipif` (true) or
  `xfail` is not run, as pytest does not count it against the test.
- `async def` tests run to completion under an event loop of their own
  (`asyncio.run`), as pytest-asyncio would.
- A test that returns a coroutine, a generator or any other awaitable fails:
  the body it stands for never ran (a plain call would count it a pass).
Fixtures other than parameters are not provided: a test that asks for one
fails with TypeError.
"""
from __future__ import annotations

import types

SKIPPING_MARKS = ("skip", "xfail")
CO_COROUTINE = 0x80
UNFINISHED = (types.CoroutineType, types.GeneratorType, types.AsyncGeneratorType)


class UnfinishedTest(AssertionError):
    """The test function returned a coroutine, generator or awaitable instead of running its checks."""


def run_test(function) -> None:
    """Call the test once per parameter set; raises what the test raised."""
    for arguments in parameter_sets(function):
        if is_coroutine_function(function):
            import asyncio  # only for async tests: its import is a tenth of the runner's start-up

            asyncio.run(function(**arguments))
            continue
        result = function(**arguments)
        if isinstance(result, UNFINISHED) or hasattr(type(result), "__await__"):
            if isinstance(result, (types.CoroutineType, types.GeneratorType)):
                result.close()
            raise UnfinishedTest(f"{getattr(function, '__name__', 'the test')} returned a "
                                 f"{type(result).__name__} instead of running")


def is_coroutine_function(function) -> bool:
    code = getattr(function, "__code__", None)
    return isinstance(code, types.CodeType) and bool(code.co_flags & CO_COROUTINE)


def parameter_sets(function) -> list[dict]:
    """Keyword arguments of each call: the product of the function's parametrize marks ([{}] without any)."""
    sets: list[dict] = [{}]
    for mark in getattr(function, "pytestmark", []):
        if getattr(mark, "name", None) == "parametrize":
            sets = [dict(old, **new) for old in sets for new in mark_sets(mark)]
    return sets


def mark_sets(mark) -> list[dict]:
    args, kwargs = tuple(mark.args), dict(mark.kwargs)
    names = args[0] if args else kwargs["argnames"]
    values = args[1] if len(args) > 1 else kwargs["argvalues"]
    names = [name.strip() for name in names.split(",") if name.strip()] if isinstance(names, str) else list(names)
    sets = []
    for value in values:
        if is_parameter_set(value):
            if any(skips(inner) for inner in value.marks):
                continue
            value = value.values
        elif len(names) == 1:
            value = (value,)
        value = tuple(value)
        if len(value) != len(names):
            raise TypeError(f"parametrize: {len(names)} names but a set of {len(value)} values")
        sets.append(dict(zip(names, value)))
    return sets


def is_parameter_set(value) -> bool:
    """`pytest.param(...)`: a named tuple of values, marks and an id."""
    return type(value).__name__ == "ParameterSet" and hasattr(value, "values") and hasattr(value, "marks")


def skips(mark) -> bool:
    name = getattr(mark, "name", None)
    if name == "skipif":
        return bool(mark.args[0]) if mark.args else bool(mark.kwargs.get("condition", True))
    return name in SKIPPING_MARKS
