"""The tests' view of the program: proxies whose every answer is plain data decoded on this side.

A test does `assert add(1, 2) == 3`. Here `add` is a `RemoteObject`; calling
it sends `(1, 2)` to the sandbox, the program runs, and its return value
comes back as wire data and is decoded into a real `int` (or list, dict...)
on this side, so the `==` that decides the test is the builtin one. Objects
that are not plain (instances of the program's classes, its functions,
generators) stay in the sandbox and come back as further `RemoteObject`s,
which equal nothing but a handle to the same object. Exceptions become what
`errors.py` says.

Iterators the program returns (generators included) support `next()` and
`for`: each `next` is a request; a run of `next`s on one iterator with no
other request between them fetches growing batches (1, 2, 4, ... up to 4096
items), so `list(gen)` costs few round trips while `next(gen); f(); next(gen)`
stays one item at a time.

Bounds: one reply is at most the session's output bound (`max_output_bytes`),
decodes to at most `WIRE_MAX_ITEMS` values, and all replies of one session
together are at most `MAX_REPLY_BYTES` and `MAX_VALUES` values; past any of
them the session is lost ("overflow" or "garbled"). So what the tests can
hold of the program's values stays near `MAX_VALUES` small objects plus
`MAX_REPLY_BYTES` of text (~150 MB), under the runner's own address-space
limit. When the program stops answering (timeout, exit, a
garbled or oversized reply) the call raises `SessionLost`, a
`BaseException`: no `except Exception` in a test can turn a hang into a pass.
"""
from __future__ import annotations

import collections
import time
import types

from tailflow.engines.reward.code.errors import ExceptionClasses, RemoteError, SessionLost, rebuild_exception
from tailflow.engines.reward.code.wire import (NEXT_BATCH_MAX, WIRE_MAX_ITEMS, wire_decode, wire_dumps, wire_encode,
                                               wire_loads)
from tailflow.engines.reward.sandbox.session import SandboxSession

__all__ = ["MAX_REPLY_BYTES", "RemoteError", "RemoteObject", "RemoteProgram", "SessionLost"]

MUTABLE_ARGUMENTS = (list, dict, set)
"""Argument types the program may change in place: their new contents are copied back after a call."""
MAX_REPLY_BYTES = 16 << 20
"""All replies of one session together."""
MAX_VALUES = 2_000_000
"""Values (each list item, dict key and value...) all replies of one session may decode to."""
_STOP = object()


class RemoteProgram:
    """One session's trusted end. `deadline` (this side's monotonic clock) bounds every request."""

    def __init__(self, session: SandboxSession) -> None:
        self.session = session
        self.next_id = 0
        self.deadline = float("inf")
        self.lost: str | None = None
        self.reply_bytes = 0
        self.values_left = MAX_VALUES
        self.classes = ExceptionClasses()
        self.pending: dict[int, collections.deque] = {}
        """Items fetched from an iterator ahead of the tests' `next`, per handle."""
        self.streak = (None, 0)
        """(handle, count) of the `next`s in a row on one iterator: how many items the next fetch asks for."""

    def request(self, op: str, **fields) -> tuple[object, dict]:
        """(decoded value, whole reply) of one request; raises what the program raised, or SessionLost."""
        if self.lost is not None:
            raise SessionLost(self.lost)
        if op != "next":
            self.streak = (None, 0)
        self.next_id += 1
        line = wire_dumps({"id": self.next_id, "op": op, **fields})
        reply = self.session.ask(line, self.deadline - time.monotonic())
        if reply.status != "ok":
            self.lose(reply.status)
        self.reply_bytes += len(reply.line)
        if self.reply_bytes > MAX_REPLY_BYTES:
            self.lose("overflow")
        try:
            answer = wire_loads(reply.line)
            if answer.get("id") != self.next_id:
                raise ValueError("a reply to another request")
            if "raise" in answer:
                error = self.exception(answer)
            else:
                return self.decode(answer["ok"]), answer
        except (ValueError, TypeError, KeyError, RecursionError, MemoryError):
            self.lose("garbled")
        raise error

    def decode(self, data) -> object:
        """`data` decoded, counted against this session's values (a ValueError past them)."""
        budget = [min(WIRE_MAX_ITEMS, self.values_left)]
        start = budget[0]
        try:
            return wire_decode(data, self.proxy, budget=budget)
        finally:
            self.values_left -= start - budget[0]

    def exception(self, reply: dict) -> BaseException:
        cls = self.classes.class_for(reply["cls"]) if type(reply.get("cls")) is dict else None
        return rebuild_exception(reply["raise"], reply.get("msg"), cls)

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

    def proxy(self, handle: dict) -> RemoteObject | type:
        if "e" in handle:
            return self.classes.class_for(handle)
        return RemoteObject(self, handle["h"], str(handle.get("n", "object")), handle.get("i") == 1)

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
            try:
                updated = self.decode(answer.get("args"))
            except (ValueError, TypeError, KeyError, RecursionError, MemoryError):
                self.lose("garbled")
            copy_back(args, updated)
        return value

    def next_item(self, number: int) -> object:
        """The iterator's next item: from what was fetched ahead, else one batch more."""
        handle, count = self.streak
        self.streak = (number, count + 1 if handle == number else 1)
        queue = self.pending.setdefault(number, collections.deque())
        if not queue:
            self.fetch(number, queue, min(2 ** (self.streak[1] - 1), NEXT_BATCH_MAX))
        item = queue[0] if queue[0] is _STOP else queue.popleft()
        if item is _STOP:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def fetch(self, number: int, queue: collections.deque, count: int) -> None:
        """One `next` request: its items, then the end of the iterator or the exception it raised after them."""
        items, answer = self.request("next", target=number, count=count)
        try:
            if type(items) is not list or len(items) > count:
                raise ValueError("a batch of another size")
            after = self.exception(answer["after"]) if type(answer.get("after")) is dict else None
        except (ValueError, TypeError, KeyError, RecursionError):
            self.lose("garbled")
        queue.extend(items)
        if after is not None:
            queue.append(after)
        elif answer.get("stop") == 1:
            queue.append(_STOP)


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


class RemoteObject:
    """An object that lives in the sandbox. Equality is identity of the remote object, decided here."""

    __slots__ = ("_program", "_number", "_type_name", "_is_iterator")

    def __init__(self, program: RemoteProgram, number: int, type_name: str, is_iterator: bool = False) -> None:
        object.__setattr__(self, "_program", program)
        object.__setattr__(self, "_number", number)
        object.__setattr__(self, "_type_name", type_name)
        object.__setattr__(self, "_is_iterator", is_iterator)

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
        if self._is_iterator:
            return self
        iterator = self._ask("iter")
        if type(iterator) is not RemoteObject or not iterator._is_iterator:
            raise TypeError(f"iter() of a remote {self._type_name} gave no iterator")
        return iterator

    def __next__(self):
        if not self._is_iterator:
            raise TypeError(f"'{self._type_name}' object is not an iterator")
        return self._program.next_item(self._number)

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
