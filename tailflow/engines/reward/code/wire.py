"""Values as plain data: the only form in which anything crosses between a program and its tests.

Both sides use this file: the trusted test runner imports it, and its source
is pasted into the sandboxed program's `main.py` (so it is stdlib only, with
no `from __future__` line). JSON carries None, bools, ints, floats, strings
and lists as themselves; the rest is tagged:

    {"t": [...]}  tuple          {"s": [...]}  set        {"fs": [...]}  frozenset
    {"d": [[k, v], ...]}  dict (any plain keys)           {"b": "<hex>"}  bytes
    {"f": "nan" | "inf" | "-inf"}  a float JSON cannot write
    {"h": n, "c": 0|1, "n": "TypeName", "i": 0|1, "a": 0|1}  a handle: any other object stays
                                          where it lives and is named by number ("c": callable,
                                          "i": an iterator, "a": awaitable); an exception class's
                                          handle also carries "e": its bases, each a builtin's
                                          name or another such handle

Types are checked exactly (`type(v) is int`), never with isinstance: an `int`
subclass whose `__eq__` always says yes is not an int here, it is a handle,
and the tests' side compares no handle with anything (`handles.py`). Decoding is
strict: anything that is not one of these shapes is a `ValueError`, and so is
a message of more than `WIRE_MAX_ITEMS` values, or a set or dict in which more
than `WIRE_MAX_SHARED_HASH` members share one hash (equal hashes make every
insertion compare with all of them: quadratic time, and the hashes of ints,
floats and tuples are the program's to choose).
"""
import json
import math

WIRE_MAX_DEPTH = 64
"""Nesting deeper than this is refused (it only serves to blow the decoder's stack)."""
WIRE_MAX_ITEMS = 200_000
"""Values one decoded message may hold (each list item, set member, dict key and value, tuple item counts)."""
WIRE_MAX_SHARED_HASH = 32
"""Members of one decoded set (keys of one dict) that may share a hash value."""
NEXT_BATCH_MAX = 4096
"""Items of an iterator one `next` request asks for, and the program's side gives, at most (a generator may be
endless)."""
HANDLE_KEYS = {"h", "c", "n", "i", "a", "e"}
PLAIN_SCALARS = (type(None), bool, int, float, str)
TAGS = {"t": tuple, "s": set, "fs": frozenset}


def wire_encode(value, to_handle, depth=0):
    """`value` as JSON-ready data; `to_handle(obj) -> dict` names an object that is not plain."""
    if depth > WIRE_MAX_DEPTH:
        raise ValueError("value nested too deeply to cross the boundary")
    kind = type(value)
    if kind is float and not math.isfinite(value):
        return {"f": "nan" if value != value else ("inf" if value > 0 else "-inf")}
    if kind in PLAIN_SCALARS:
        return value
    if kind is list:
        return [wire_encode(item, to_handle, depth + 1) for item in value]
    for tag, container in TAGS.items():
        if kind is container:
            return {tag: [wire_encode(item, to_handle, depth + 1) for item in value]}
    if kind is dict:
        return {"d": [[wire_encode(k, to_handle, depth + 1), wire_encode(v, to_handle, depth + 1)]
                      for k, v in value.items()]}
    if kind is bytes:
        return {"b": value.hex()}
    return to_handle(value)


def wire_decode(data, from_handle, depth=0, budget=None, on_nan=None):
    """The value `data` stands for; `from_handle(dict) -> object` turns a handle into this side's object.
    `budget`: a one-item list, the values this message may still hold (`WIRE_MAX_ITEMS` per call from outside).
    `on_nan()`, when given, is what a NaN decodes to (the test runner's raises: a NaN is no answer)."""
    if depth > WIRE_MAX_DEPTH:
        raise ValueError("value nested too deeply to cross the boundary")
    budget = [WIRE_MAX_ITEMS] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError("more values than one message (or one session) may hold")
    kind = type(data)
    if kind in PLAIN_SCALARS:
        return data
    if kind is list:
        return [wire_decode(item, from_handle, depth + 1, budget, on_nan) for item in data]
    if kind is not dict:
        raise ValueError(f"not a wire value: {kind.__name__}")
    if "h" in data:
        if type(data["h"]) is not int or not set(data) <= HANDLE_KEYS:
            raise ValueError("a wire handle is {'h': int, 'c': 0|1, 'n': str, 'i': 0|1, 'e': [bases]}")
        return from_handle(data)
    if len(data) != 1:
        raise ValueError("a tagged wire value has exactly one key")
    tag, body = next(iter(data.items()))
    if tag in TAGS and type(body) is list:
        items = [wire_decode(item, from_handle, depth + 1, budget, on_nan) for item in body]
        if TAGS[tag] is not tuple:
            check_hash_spread(items)
        return TAGS[tag](items)
    if tag == "d" and type(body) is list:
        pairs = [wire_decode(pair, from_handle, depth + 1, budget, on_nan) for pair in body]
        if not all(type(pair) is list and len(pair) == 2 for pair in pairs):
            raise ValueError("a wire dict is a list of [key, value] pairs")
        check_hash_spread([key for key, _ in pairs])
        return {key: value for key, value in pairs}
    if tag == "b" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "f" and body in ("nan", "inf", "-inf"):
        return on_nan() if body == "nan" and on_nan is not None else float(body)
    raise ValueError(f"not a wire value: tag {tag!r}")


def check_hash_spread(members):
    """Refuse a set or dict whose members pile up on one hash value (linear time: hash values themselves are
    ints whose own hashes differ, so counting them cannot collide)."""
    if len(members) <= WIRE_MAX_SHARED_HASH:
        return
    counts = {}
    for member in members:
        value = hash(member)
        counts[value] = counts.get(value, 0) + 1
        if counts[value] > WIRE_MAX_SHARED_HASH:
            raise ValueError(f"more than {WIRE_MAX_SHARED_HASH} members of one set or dict share a hash")


def wire_dumps(message):
    """One line of JSON (no NaN tokens: those are tagged above)."""
    return json.dumps(message, allow_nan=False, separators=(",", ":")) + "\n"


def wire_loads(line):
    """A JSON object from one line; NaN/Infinity tokens are refused (they would bypass the float tag)."""
    def refuse(token):
        raise ValueError(f"bare {token} on the wire")
    message = json.loads(line, parse_constant=refuse)
    if type(message) is not dict:
        raise ValueError("a wire message is a JSON object")
    return message
