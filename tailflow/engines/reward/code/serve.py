"""The inside of a code-test session: load the program, then answer calls as plain data until stdin closes.

Pasted after `wire.py` into the sandbox's `main.py` (stdlib only, no
`from __future__` line). This side holds the program and nothing else: no
test, no expected value, no verdict, no clock anyone trusts. It answers
requests (one JSON line each, carrying an `id`) such as "call handle 3 with
these arguments" with "it returned this value" or "it raised ValueError".
Whatever the program does to this code (patch it, forge replies, write to
the channel itself), all the tests ever see is a value the program could
have returned anyway, or an exception the runner rebuilds by its own rules:
the comparison happens on the other side.

The channel is a private copy of the original stdin/stdout; the program's
own fd 0 reads /dev/null and its prints go to stderr, so `print` and
`input()` inside the program cannot disturb it.
"""
import builtins
import os
import sys
import types

SERVE_MESSAGE_LIMIT = 200
"""Characters of an exception message sent back."""
MAX_EXCEPTION_BASES = 8


class HandleTable:
    """Objects that are not plain data stay here; the tests get their numbers. One object, one number,
    so handle equality on the other side is identity here."""

    def __init__(self):
        self.objects = []
        self.numbers = {}
        self.loop = None
        """The event loop the program's awaitables run on: made on the first `await`, kept for the session, so
        what one await leaves bound to it (a lock, a queue, a task) works on the next."""

    def to_handle(self, obj):
        number = self.numbers.get(id(obj))
        if number is None:
            number = self.numbers[id(obj)] = len(self.objects)
            self.objects.append(obj)  # kept alive, so its id is never reused
        handle = {"h": number, "c": int(callable(obj)), "n": type(obj).__name__[:60],
                  "i": int(hasattr(type(obj), "__next__")), "a": int(hasattr(type(obj), "__await__"))}
        if isinstance(obj, type) and issubclass(obj, BaseException):  # the tests may `except` it
            handle["n"] = obj.__name__[:60]
            handle["e"] = [base.__name__ if base.__module__ == "builtins" else self.to_handle(base)
                           for base in obj.__bases__[:MAX_EXCEPTION_BASES]]
        return handle

    def from_handle(self, data):
        return self.objects[data["h"]]


def exception_reply(table, error):
    """What crosses for an exception: its class's name, its message and, for the program's own classes, a
    handle to the class (so a test can `except` it). The runner decides what it becomes."""
    reply = {"raise": type(error).__name__[:60], "msg": str(error)[:SERVE_MESSAGE_LIMIT]}
    if getattr(builtins, type(error).__name__, None) is not type(error):
        reply["cls"] = table.to_handle(type(error))
    return reply


def next_items(table, target, count):
    """Up to `count` items of an iterator, whether it ended, and the exception it raised after them."""
    items, reply = [], {"stop": 0}
    try:
        for _ in range(max(1, min(count, NEXT_BATCH_MAX))):
            items.append(next(target))
    except StopIteration:
        reply["stop"] = 1
    except BaseException as error:  # noqa: BLE001 - raised after the items it gave: crosses after them
        if not items:
            raise
        reply["after"] = exception_reply(table, error)
    reply["ok"] = wire_encode(items, table.to_handle)
    return reply


def run_awaitable(table, awaitable):
    """What an awaitable of the program's (a coroutine, a future) gives, run to its end on the session's loop."""
    import asyncio  # only for async programs: its import is a tenth of the session's start-up

    if table.loop is None:
        table.loop = asyncio.new_event_loop()
    return table.loop.run_until_complete(awaitable)


def serve_op(table, request, solution, program):
    """The reply's payload for one request (raises what the program raised)."""
    op = request["op"]
    decode = lambda key: wire_decode(request[key], table.from_handle)  # noqa: E731
    if op == "load":
        exec(compile(program, "solution.py", "exec"), solution.__dict__)
        names = [[name, value] for name, value in vars(solution).items() if not name.startswith("__")]
        return {"ok": wire_encode(names, table.to_handle)}
    target = table.objects[request["target"]]
    if op == "call":
        args, kwargs = decode("args"), dict(decode("kwargs"))
        result = target(*args, **kwargs)
        reply = {"ok": wire_encode(result, table.to_handle)}
        if request.get("want_args"):
            reply["args"] = wire_encode(args, table.to_handle)
        return reply
    if op == "next":
        return next_items(table, target, int(request.get("count", 1)))
    actions = {
        "getattr": lambda: getattr(target, request["name"]),
        "setattr": lambda: setattr(target, request["name"], decode("value")),
        "getitem": lambda: target[decode("key")],
        "setitem": lambda: target.__setitem__(decode("key"), decode("value")),
        "len": lambda: len(target),
        "bool": lambda: bool(target),
        "contains": lambda: decode("item") in target,
        "str": lambda: str(target),
        "iter": lambda: iter(target),  # an iterator has `__next__`, so no plain type: it crosses as a handle
        "await": lambda: run_awaitable(table, target),
    }
    return {"ok": wire_encode(actions[op](), table.to_handle)}


def serve_forever(program):
    channel_in = os.fdopen(os.dup(0), "rb")
    channel_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    solution = types.ModuleType("solution")
    sys.modules["solution"] = solution
    table = HandleTable()
    for line in channel_in:
        request = wire_loads(line)
        try:
            reply = serve_op(table, request, solution, program)
        except BaseException as error:  # noqa: BLE001 - whatever the program raised is its answer
            try:
                reply = exception_reply(table, error)
            except BaseException:  # noqa: BLE001 - an exception whose str() raises: its name only
                reply = {"raise": type(error).__name__[:60], "msg": ""}
        reply["id"] = request["id"]
        try:
            text = wire_dumps(reply)
        except ValueError as error:
            text = wire_dumps({"id": request["id"], "raise": "ValueError", "msg": str(error)[:SERVE_MESSAGE_LIMIT]})
        channel_out.write(text.encode("utf-8", errors="replace"))
        channel_out.flush()
