"""Waiting on a group of actor calls without hanging on a dead member.

`ray.get([...])` waits for every call; when one trainer rank dies the others
sit in a collective that never completes, so the driver would wait for gloo's
timeout (30 minutes). `get_all` raises the first failure as soon as it lands.
"""
from __future__ import annotations

from typing import Any, Sequence


def get_all(refs: Sequence[Any]) -> list[Any]:
    import ray

    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        ray.get(ready)  # raises RayActorError / RayTaskError of a failed call right away
    return ray.get(list(refs))
