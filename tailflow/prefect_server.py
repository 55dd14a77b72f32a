"""The process `tailflow server` becomes: Prefect's own `prefect server start`, run in this interpreter, with the
heap it frees handed back to the operating system every `HEAP_TRIM_S` seconds (tailflow/heap.py).

Why: under a long run the server's glibc heap kept memory it had freed, and its RSS climbed with it. Side by side,
800 micro iterations of `tailflow train` against a server each (docs/operations.md, *Long runs*): Prefect's server
as it comes went 261 -> 278 MB from iteration 200 to 800 (+3.67 MB per 100 iterations); with this trim and
`MALLOC_ARENA_MAX=2` (prefect_ops.server_environment) 244 -> 251 MB (+0.73), and -0.08 over 500-800. Where the C
library has no `malloc_trim` (not glibc), the server runs as Prefect's, untouched.

Usage, as `tailflow server` execs it: `python -m tailflow.prefect_server server start --host H --port P`.
"""
from __future__ import annotations

import runpy
import sys

from tailflow.heap import HEAP_TRIM_S, trim_heap_every


def main(prefect_args: list[str]) -> None:
    trim_heap_every(HEAP_TRIM_S)
    sys.argv = ["prefect", *prefect_args]
    runpy.run_module("prefect", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
