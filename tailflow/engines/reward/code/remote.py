"""The tests' view of the program: proxies whose every answer is plain data decoded on this side.

A test does `assert add(1, 2) == 3`. Here `add` is a `RemoteObject`; calling
it sends `(1, 2)` to the sandbox, the program runs, and its return value
comes back as wire data and is decoded into a real `int` (or list, dict...)
on this side, so the `==` that decides the test is the builtin one. Objects
that are not plain (instances of the program's classes, its functions,
generators) stay in the sandbox and come back as further `RemoteObject`s,
which equal nothing but a handle to the same object.

Exceptions the program raises arrive as the builtin exception of that name
(a `ValueError` stays a `ValueError`, so `pytest.raises(ValueError)` works),
or `RemoteError` for its own classes. When the program stops answering
(timeout, exit, a garbled or oversized reply) the call raises `SessionLost`,
a `BaseException`: no `except Exception` in a test can turn a hang into a
pass, and the runner fails the test whatever the test code did with it.
"""
from __future__ import annotations

import builtins
import time
import types

from tailflow.engines.reward.code.wire import wire_decode, wire_dumps, wire_encode, wire_loads
from tailflow.engines.reward.sandbox.session import SandboxSession

MUTABLE_ARGUMENTS = (list, dict, set)
"""Argument types the program may change in place: their new contents are copied back after a call."""


class SessionLost(BaseException):
    """The program stopped answering; `reason` is "timeout", "closed", "overflow" or "garbled"."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RemoteError(Exception):
    """The program raised an exception of its own class (or one that cannot be rebuilt here)."""


class RemoteProgram:
    """One session's trusted end. `deadline` (this side's monotonic clock) bounds every request."""

    def __init__(self, session: SandboxSession) -> None:
        self.session = session
        self.next_id = 0
        self.deadline = float("inf")
        self.lost: str | None = None

    def request(self, op: str, **fields) -> tuple[object, dict]:
        """(decoded value, whole reply) of one request; raises what the program raised, or SessionLost."""
        if self.lost is not None:
            raise SessionLost(self.lost)
        self.next_id += 1
        line = wire_dumps({"id": self.next_id, "op": op, **fields})
        reply = self.session.ask(line, self.deadline - time.monotonic())
        if reply.status != "ok":
            self.lose(reply.status)
        try:
            answer = wire_loads(reply.line)
            if answer.get("id") != self.next_id:
                raise ValueError("a reply to another request")
            if "raise" in answer:
                error = rebuild_exception(answer["raise"], answer.get("msg"))
            else:
                return wire_decode(answer["ok"], self.proxy), answer
        except (ValueError, TypeError, KeyError, RecursionError):
            self.lose("garbled")
        raise error

    def lose(self, reason: str) -> None:
        self.lost = reason
        self.session.close()
        raise SessionLost(reason)

    def encode(self, value) -> object:
        return wire_encode(value, self.handle_of)

    def handle_of(self, obj) -> dict:
        if type(obj) is RemoteObject and obj._program is self:
            return {"h": obj._number}
        raise TypeError(f"a {type(obj).__name__} cannot be passed to the program (only plain data and the "
                        "program's own objects cross)")

    def proxy(self, handle: dict) -> RemoteObject:
        return RemoteObject(self, handle["h"], str(handle.get("n", "object")))

    def load(self) -> types.ModuleType:
        """Run the program (the sandbox holds its source); its top-level names as module `solution`, plain
        values as themselves."""
        names, _ = self.request("load")
        module = types.ModuleType("solution")
        for name, value in names:
            if type(name) is str:
                setattr(module, name, value)
        return module

    def call(self, target: RemoteObject, args: tuple, kwargs: dict) -> object:
        args = list(args)
        want_args = any(type(arg) in MUTABLE_ARGUMENTS for arg in args)
        value, answer = self.request("call", target=target._number, args=self.encode(args),
                                     kwargs=self.encode([[k, v] for k, v in kwargs.items()]), want_args=want_args)
        if want_args:
            copy_back(args, wire_decode(answer.get("args"), self.proxy))
        return value


def copy_back(originals: list, updated) -> None:
    """Give in-place changes the program made to list, dict and set arguments back to the test's objects."""
    if type(updated) is not list or len(updated) != len(originals):
        raise ValueError("the arguments came back in another shape")
    for original, new in zip(originals, updated):
        if type(original) is list and type(new) is list:
            original[:] = new
        elif type(original) in (dict, set) and type(new) is type(original):
            original.clear()
            original.update(new)


def rebuild_exception(name, message) -> BaseException:
    """The builtin exception class of that name with the program's message, else `RemoteError`."""
    if type(name) is not str or type(message) not in (str, type(None)):
        raise ValueError("a malformed exception reply")
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except TypeError:
            pass
    return RemoteError(f"{name}: {message}")


class RemoteObject:
    """An object that lives in the sandbox. Equality is identity of the remote object, decided here."""

    __slots__ = ("_program", "_number", "_type_name")

    def __init__(self, program: RemoteProgram, number: int, type_name: str) -> None:
        object.__setattr__(self, "_program", program)
        object.__setattr__(self, "_number", number)
        object.__setattr__(self, "_type_name", type_name)

    def _ask(self, op: str, **fields):
        return self._program.request(op, target=self._number, **fields)[0]

    def __call__(self, *args, **kwargs):
        return self._program.call(self, args, kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name=name)

    def __setattr__(self, name: str, value) -> None:
        self._ask("setattr", name=name, value=self._program.encode(value))

    def __getitem__(self, key):
        return self._ask("getitem", key=self._program.encode(key))

    def __setitem__(self, key, value) -> None:
        self._ask("setitem", key=self._program.encode(key), value=self._program.encode(value))

    def __len__(self) -> int:
        return self._ask("len")

    def __bool__(self) -> bool:
        return self._ask("bool")

    def __contains__(self, item) -> bool:
        return self._ask("contains", item=self._program.encode(item))

    def __iter__(self):
        return iter(self._ask("iter"))

    def __str__(self) -> str:
        return self._ask("str")

    def __repr__(self) -> str:
        return f"<remote {self._type_name} #{self._number}>"

    def __eq__(self, other) -> bool:
        if type(other) is not RemoteObject:
            return NotImplemented
        return other._program is self._program and other._number == self._number

    def __hash__(self) -> int:
        return hash((id(self._program), self._number))
