"""What a test may do with an object of the program's that is not plain data, and who answers.

An object that is not plain data (an instance of the program's class, a
function, a generator, a coroutine) stays in the sandbox; the tests hold a
`RemoteObject` naming it. The rule (docs/rewards.md, "What a returned object
may do"):

- The program answers requests for *values*: a call, an attribute, an item
  (`obj[k]`), `len`, `str`, the truth of the object, the next items of an
  iterator, the result of an awaitable. Each answer crosses as plain data and
  the runner's own operators decide what the test does with it: the same an
  honest function returning that value gives.
- The program never decides a *comparison*: `==`, `!=`, `<`, `<=`, `>`, `>=`
  with a handle on either side raise `Refused` (an object whose every
  comparison says yes, or one shared object returned for every call, passed
  `!=` and `==` tests when a handle's equality was identity).
- Membership, `x in obj`, is the runner's `in` over the object's items, read to
  the end (a container that claims to contain everything has to list it).
  Only an object the test built itself, by calling a name of the program's
  spelled as a class (a capital first letter, PEP 8's class names: `Stack()`,
  `Solution()`), answers `in` with its own `__contains__`, and only with a
  real bool: that class is what the test tests.
- An iterator gives a test at most `MAX_ITERATOR_ITEMS` items; the test that
  asks for one more fails (`remote.py`).

A returned coroutine is a `RemoteAwaitable`: a coroutine on the tests' side
(so `await`, `asyncio.gather` and `asyncio.run` take it) whose one step asks
the sandbox to run the program's coroutine to its end and returns its value.
"""
from __future__ import annotations

from typing import Protocol

from tailflow.engines.reward.code.errors import Refused


class ProgramChannel(Protocol):
    """What a handle asks of the program it came from (`remote.RemoteProgram`, which imports this module)."""

    def request(self, op: str, *, nan_ok: bool = False, **fields) -> tuple[object, dict]: ...

    def encode(self, value) -> object: ...

    def call(self, target: "RemoteObject", args: tuple, kwargs: dict) -> object: ...

    def next_item(self, number: int) -> object: ...


def refuse_comparison(self, other):
    raise Refused(f"a {self._type_name} of the program's is not plain data: the tests compare values, "
                  "not the program's objects")


class RemoteObject:
    """An object that lives in the sandbox. Compared with nothing; `in` decided here (see the module)."""

    __slots__ = ("_program", "_number", "_type_name", "_is_iterator", "_builds", "_built")

    def __init__(self, program: ProgramChannel, number: int, type_name: str, is_iterator: bool = False) -> None:
        object.__setattr__(self, "_program", program)
        object.__setattr__(self, "_number", number)
        object.__setattr__(self, "_type_name", type_name)
        object.__setattr__(self, "_is_iterator", is_iterator)
        object.__setattr__(self, "_builds", False)
        """Set on the proxy of a top-level name spelled as a class: calling it builds an object under test."""
        object.__setattr__(self, "_built", False)
        """Set on what calling such a proxy returned: it answers `in` itself."""

    def _ask(self, op: str, **fields):
        return self._program.request(op, target=self._number, **fields)[0]

    def __call__(self, *args, **kwargs):
        result = self._program.call(self, args, kwargs)
        if self._builds and type(result) is RemoteObject:
            object.__setattr__(result, "_built", True)
        return result

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
        if not self._built:
            return item in [value for value in self]  # no `len()` first: a program's length is no bound here
        answer = self._ask("contains", item=self._program.encode(item))
        if type(answer) is not bool:
            raise Refused(f"`in` on a {self._type_name} answered {type(answer).__name__}, not a bool")
        return answer

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

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = refuse_comparison

    def __hash__(self) -> int:
        return hash((id(self._program), self._number))


class RemoteAwaitable:
    """An awaitable of the program's (its `async def` called), as a coroutine here: `await`, `asyncio.gather`,
    `asyncio.run` and tasks drive it with `send(None)`, which runs it to its end in the sandbox (on the
    session's own event loop) and returns its value; so awaitables a test gathers run one after another there.
    Compared with nothing, like any handle."""

    __slots__ = ("_program", "_number", "_type_name", "_is_done")

    def __init__(self, program: ProgramChannel, number: int, type_name: str) -> None:
        self._program = program
        self._number = number
        self._type_name = type_name
        self._is_done = False

    def __await__(self):
        return self

    def __next__(self):
        return self.send(None)

    def send(self, value):
        if self._is_done:
            raise RuntimeError(f"cannot reuse an already awaited {self._type_name}")
        self._is_done = True
        raise StopIteration(self._program.request("await", target=self._number)[0])

    def throw(self, typ, value=None, traceback=None):
        self._is_done = True
        raise typ if value is None else value

    def close(self) -> None:
        self._is_done = True

    def __repr__(self) -> str:
        return f"<remote {self._type_name} #{self._number}>"

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = refuse_comparison
    __hash__ = object.__hash__
