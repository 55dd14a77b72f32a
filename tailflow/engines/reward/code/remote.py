"""The tests' view of the program: proxies whose every answer is plain data decoded on this side.

A test does `assert add(1, 2) == 3`. Here `add` is a `RemoteObject`; calling
it sends `(1, 2)` to the sandbox, the program runs, and its return value
comes back as wire data and is decoded into a real `int` (or list, dict...)
on this side, so the `==` that decides the test is the builtin one. Objects
that are not plain (instances of the program's classes, its functions,
generators, coroutines) stay in the sandbox and come back as handles
(`handles.py`: what a test may do with one; no comparison is ever the
program's). Exceptions become what `errors.py` says. A NaN in any answer
fails the test (`Refused`): it makes every comparison false, so
`assert not result > limit` held for it; this decoding is the one place every
value enters the tests. Infinities are numbers and stay.

Iterators the program returns (generators included) support `next()` and
`for`: each `next` is a request; a run of `next`s on one iterator with no
other request between them fetches growing batches (1, 2, 4, ... up to 4096
items), so `list(gen)` costs few round trips while `next(gen); f(); next(gen)`
stays one item at a time. One iterator gives the tests at most
`MAX_ITERATOR_ITEMS` items: the test that asks for one more fails (`Refused`),
so an endless generator fails the test that reads it to its end, at a
bounded cost.

Bounds: one reply is at most the session's output bound (`max_output_bytes`),
decodes to at most `WIRE_MAX_ITEMS` values, and all replies of one session
together are at most `MAX_REPLY_BYTES` and `MAX_VALUES` values; past any of
them the session is lost ("overflow" or "garbled"). So what the tests can
hold of the program's values stays near `MAX_VALUES` small objects plus
`MAX_REPLY_BYTES` of text (~150 MB), under the runner's own address-space
limit. When the program stops answering (timeout, exit, a
garbled or oversized reply) the call raises `SessionLost`, a
`BaseException`: no `except Exception` in a test can turn a hang into a pass.
What the program did in each test's calls (raised, answered) is counted in
`outcomes` for `passes.py`.
"""
from __future__ import annotations

import collections
import time
import types

from tailflow.engines.reward.code.errors import ExceptionClasses, Refused, RemoteError, SessionLost, rebuild_exception
from tailflow.engines.reward.code.handles import RemoteAwaitable, RemoteObject
from tailflow.engines.reward.code.passes import CallOutcomes
from tailflow.engines.reward.code.wire import (NEXT_BATCH_MAX, WIRE_MAX_ITEMS, wire_decode, wire_dumps, wire_encode,
                                               wire_loads)
from tailflow.engines.reward.sandbox.session import SandboxSession

__all__ = ["MAX_ITERATOR_ITEMS", "MAX_REPLY_BYTES", "RemoteAwaitable", "RemoteError", "RemoteObject",
           "RemoteProgram", "SessionLost"]

MUTABLE_ARGUMENTS = (list, dict, set)
"""Argument types the program may change in place: their new contents are copied back after a call."""
MAX_REPLY_BYTES = 16 << 20
"""All replies of one session together."""
MAX_VALUES = 2_000_000
"""Values (each list item, dict key and value...) all replies of one session may decode to."""
MAX_ITERATOR_ITEMS = 1 << 18
"""Items one iterator of the program's may give the tests (262,144: above what a test reads of an honest
generator, below what a session may decode); asking for one more fails the test."""
RAISING_OPS = ("call", "await", "next")
"""Requests whose exception is the program's answer (a function, a coroutine, a generator raising); a probe
such as `len` or `getattr` raising is not counted (Python's own `list()` asks `len` and expects TypeError)."""
UNANSWERING_OPS = ("load", "setattr", "setitem", "iter")
"""Requests whose reply is not a value the test receives."""
_STOP = object()
_ENDLESS = object()


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
        self.fetched: dict[int, int] = {}
        """Items fetched from each iterator so far (bounded by `MAX_ITERATOR_ITEMS`)."""
        self.streak = (None, 0)
        """(handle, count) of the `next`s in a row on one iterator: how many items the next fetch asks for."""
        self.outcomes = CallOutcomes()
        self.num_proxies = 0

    def request(self, op: str, *, nan_ok: bool = False, **fields) -> tuple[object, dict]:
        """(decoded value, whole reply) of one request; raises what the program raised, or SessionLost (or
        Refused: a NaN in the reply, unless `nan_ok`)."""
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
                proxies = self.num_proxies
                value = self.decode(answer["ok"], nan_ok)
                self.outcomes.answered += op not in UNANSWERING_OPS and self.num_proxies == proxies
                return value, answer
        except (ValueError, TypeError, KeyError, RecursionError, MemoryError):
            self.lose("garbled")
        self.outcomes.raised += op in RAISING_OPS
        raise error

    def decode(self, data, nan_ok: bool = False) -> object:
        """`data` decoded, counted against this session's values (a ValueError past them); a NaN in it raises
        Refused unless `nan_ok`."""
        budget = [min(WIRE_MAX_ITEMS, self.values_left)]
        start = budget[0]
        try:
            return wire_decode(data, self.proxy, budget=budget, on_nan=None if nan_ok else refuse_nan)
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
        if type(obj) in (RemoteObject, RemoteAwaitable) and obj._program is self:
            return {"h": obj._number}
        raise TypeError(f"a {type(obj).__name__} cannot be passed to the program (only plain data and the "
                        "program's own objects cross)")

    def proxy(self, handle: dict) -> RemoteObject | RemoteAwaitable | type:
        if "e" in handle:
            return self.classes.class_for(handle)
        self.num_proxies += 1
        type_name = str(handle.get("n", "object"))
        if handle.get("a") == 1:
            return RemoteAwaitable(self, handle["h"], type_name)
        return RemoteObject(self, handle["h"], type_name, handle.get("i") == 1)

    def load(self) -> types.ModuleType:
        """Run the program (the sandbox holds its source); its top-level names as module `solution`, plain
        values as themselves. The proxy of a name spelled as a class (capital first letter) builds objects
        under test (`handles.py`): the name is the tests' to use, so the program cannot make a function one."""
        names, _ = self.request("load", nan_ok=True)
        module = types.ModuleType("solution")
        for name, value in names:
            if type(name) is str:
                setattr(module, name, value)
                if type(value) is RemoteObject and name[:1].isupper():
                    object.__setattr__(value, "_builds", True)
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
        item = queue[0] if queue[0] is _STOP or queue[0] is _ENDLESS else queue.popleft()
        if item is _STOP:
            raise StopIteration
        if item is _ENDLESS:
            raise Refused(f"an iterator of the program's gave more than {MAX_ITERATOR_ITEMS} items")
        if isinstance(item, BaseException):
            self.outcomes.raised += 1
            raise item
        return item

    def fetch(self, number: int, queue: collections.deque, count: int) -> None:
        """One `next` request: its items, then the end of the iterator or the exception it raised after them.
        It asks for at most one item past the iterator's bound, to tell an iterator that ends there from one
        that goes on."""
        room = MAX_ITERATOR_ITEMS - self.fetched.get(number, 0)
        count = min(count, room + 1)
        items, answer = self.request("next", target=number, count=count)
        try:
            if type(items) is not list or len(items) > count:
                raise ValueError("a batch of another size")
            after = self.exception(answer["after"]) if type(answer.get("after")) is dict else None
        except (ValueError, TypeError, KeyError, RecursionError):
            self.lose("garbled")
        self.fetched[number] = self.fetched.get(number, 0) + len(items)
        queue.extend(items[:room])
        if len(items) > room:
            queue.append(_ENDLESS)
        elif after is not None:
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


def refuse_nan() -> float:
    raise Refused("the program answered NaN: no comparison with it means anything (`not nan > x` holds)")
