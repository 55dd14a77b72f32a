"""What the program's exceptions become on the tests' side, by the runner's rules, never by the program's.

Only ordinary exceptions cross as themselves: a builtin subclass of
`Exception` other than `StopIteration` and `StopAsyncIteration`. Control flow
and the other `BaseException`s arrive as `RemoteError`. The program's own
exception classes arrive as classes made here, one per remote class, with the
same name and the same hierarchy over ordinary builtins (any other base
becomes `RemoteError`, which each of them derives from). Only the name, the
message and the bases cross; no code of the program's runs here. What each
rule makes work, and what it stops: docs/rewards.md, "Exceptions".
"""
from __future__ import annotations

import builtins

CONTROL_FLOW = (StopIteration, StopAsyncIteration)
MAX_BASES = 8
MAX_CLASS_DEPTH = 32


class SessionLost(BaseException):
    """The program stopped answering; `reason` is "timeout", "closed", "overflow" or "garbled"."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Refused(BaseException):
    """The runner will not use a value of the program's the way the test asked: compare an object that is not
    plain data, take a NaN as a number, read an iterator past its bound (docs/rewards.md, "What a returned
    object may do"). The test fails; as a `BaseException`, no `except Exception` or `pytest.raises` in it can
    turn the refusal into a pass."""


class RemoteError(Exception):
    """The program raised an exception that does not cross as itself (its own class, control flow)."""


def ordinary_builtin(name) -> type | None:
    """The builtin exception class `name` if it may cross as itself, else None."""
    cls = getattr(builtins, name, None) if type(name) is str else None
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, CONTROL_FLOW):
        return cls
    return None


def rebuild_exception(name, message, cls: type | None = None) -> BaseException:
    """The exception to raise in the tests: `cls` (a class made by `ExceptionClasses`) or the ordinary builtin
    of that name, with the program's message; `RemoteError` when neither can be built."""
    if type(name) is not str or type(message) not in (str, type(None)):
        raise ValueError("a malformed exception reply")
    for candidate in (cls, ordinary_builtin(name)):
        if candidate is not None:
            try:
                return candidate(message)
            except TypeError:  # a builtin that needs more arguments (UnicodeDecodeError ...)
                pass
    return RemoteError(f"{name}: {message}")


class ExceptionClasses:
    """This side's class for each of the program's exception classes, made once per remote class (so the class
    a test imported is the class the program's raise arrives as)."""

    def __init__(self) -> None:
        self.made: dict[int, type] = {}

    def class_for(self, handle: dict, depth: int = 0) -> type:
        number = handle["h"]
        if number in self.made:
            return self.made[number]
        if depth > MAX_CLASS_DEPTH or type(handle.get("e")) is not list or type(handle.get("n")) is not str:
            raise ValueError("a malformed exception class handle")
        bases = list(dict.fromkeys(self.base_for(base, depth) for base in handle["e"][:MAX_BASES]))
        if not any(issubclass(base, RemoteError) for base in bases):
            bases.insert(0, RemoteError)
        name = handle["n"][:60]
        try:
            cls = type(name, tuple(bases), {"__module__": "solution"})
        except TypeError:  # bases this side cannot combine: the class still exists, as a RemoteError
            cls = type(name, (RemoteError,), {"__module__": "solution"})
        self.made[number] = cls
        return cls

    def base_for(self, base, depth: int) -> type:
        if type(base) is str:
            return ordinary_builtin(base) or RemoteError
        if type(base) is dict and type(base.get("h")) is int:
            return self.class_for(base, depth + 1)
        raise ValueError("a malformed exception base")
