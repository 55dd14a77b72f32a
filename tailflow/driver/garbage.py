"""The driver's garbage: collected after every iteration, over only what the run made since it started.

A run's driver holds ~600,000 objects that Python's cyclic collector tracks (torch, transformers, Prefect, Ray,
the config), and each iteration leaves ~600-1,000 objects in reference cycles (Prefect's engine and the states
it passes around, the report's closed figures). CPython runs a full collection only once the objects that
survived since the last one reach a quarter of those it holds, so a driver piled up many iterations of garbage
between full collections, and the heap that garbage grew stayed: its RSS rose in steps of 5-15 MB
(bench/longrun.py). A full collection after every iteration kept it level, but over all those objects it took
~0.25 s an iteration (docs/operations.md, *Long runs*).

So `iteration_garbage_collected` first moves every object alive before the first iteration out of the
collector's sight (`gc.freeze`: they are still freed by reference counting; only cycles among them are no longer
looked for), and the full collection after each iteration then traverses only what the run made since: ~2 ms.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def iteration_garbage_collected() -> Iterator[None]:
    """Around a run's iterations: what is alive now (libraries, models, clients) left to reference counting, and
    given back to the collector at the end. If something in this process has frozen objects already, nothing is
    frozen or given back here: the collections then traverse everything, and cost more."""
    ours = gc.get_freeze_count() == 0
    if ours:
        gc.collect()
        gc.freeze()
    try:
        yield
    finally:
        if ours:
            gc.unfreeze()


def collect_iteration_garbage() -> int:
    """After an iteration: free its reference cycles now, not many iterations later. Returns how many objects
    were unreachable."""
    return gc.collect()
