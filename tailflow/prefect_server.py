"""The process `tailflow server` becomes: Prefect's own `prefect server start`, run in this interpreter, with the
heap it frees handed back to the operating system every `HEAP_TRIM_S` seconds.

Why: under a long run the server's glibc heap kept memory it had freed, and its RSS climbed with it. Side by side,
800 micro iterations of `tailflow train` against a server each (docs/operations.md, *Long runs*): Prefect's server
as it comes went 261 -> 278 MB from iteration 200 to 800 (+3.67 MB per 100 iterations); with this trim and
`MALLOC_ARENA_MAX=2` (prefect_ops.server_environment) 244 -> 251 MB (+0.73), and -0.08 over 500-800. Where the C
library has no `malloc_trim` (not glibc), the server runs as Prefect's, untouched.

Usage, as `tailflow server` execs it: `python -m tailflow.prefect_server server start --host H --port P`.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import runpy
import sys
import threading
import time

HEAP_TRIM_S = 5.0
"""A trim walks every free chunk of the heap, in this thread with the GIL released (ctypes releases it): one took
~55 ms on a test process's fragmented 1.4 GB heap here; the server's heap is ~80 MB. Not measured in the server."""


def glibc_malloc_trim():
    """glibc's `malloc_trim`, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed_heap() -> bool:
    """Hand the pages of every free heap chunk back to the OS now; False where that cannot be done."""
    trim = glibc_malloc_trim()
    return trim is not None and bool(trim(0))


def trim_heap_every(seconds: float) -> threading.Thread | None:
    """A daemon thread calling `malloc_trim(0)` every `seconds`; None (and no thread) without glibc."""
    trim = glibc_malloc_trim()
    if trim is None:
        return None

    def loop() -> None:
        while True:
            time.sleep(seconds)
            trim(0)

    thread = threading.Thread(target=loop, name="tailflow-heap-trim", daemon=True)
    thread.start()
    return thread


def main(prefect_args: list[str]) -> None:
    trim_heap_every(HEAP_TRIM_S)
    sys.argv = ["prefect", *prefect_args]
    runpy.run_module("prefect", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
