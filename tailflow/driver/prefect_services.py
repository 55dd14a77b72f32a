"""Let go of what prefect 3.8.8 keeps for the life of a process or a flow run and a run's driver never needs again.

Two things grew in a run's driver with every iteration (bench/longrun.py): stopped client services, and the
parent flow run's dependency tracking.

Each Prefect client service (the events worker that sends a task's or an artifact's events to the server, the
log worker) registers, when it starts, one call to drain it at thread shutdown
(`threading._register_atexit`) and one on Prefect's global loop thread (`add_shutdown_call`). Both lists keep
the service after it stopped, and a service stops at every flow run's end: the next event starts a new one.
Through them a run's driver kept every events worker it ever started with its closed websocket connection and
its zlib compressor: about 1.4 of them an iteration, ~3.3 MB of native memory an iteration (bench/longrun.py,
measured with /proc's RssAnon and gc; 17 stopped `EventsWorker`s alive after 12 iterations).

`release_stopped_services` drops the calls whose service has stopped: draining a stopped service at exit does
nothing, so nothing is lost. It reaches into CPython's `threading._threading_atexits` and Prefect's loop
thread, both private; if either is not there (another version), it does nothing.

`forget_dead_results` prunes the parent flow run's `FlowRunContext.run_results`. For every result a task or
subflow returns (and each item one level inside it), Prefect records `id(result) -> (a copy of its state, ...)`,
to draw an arrow in the UI when that object is passed to a later task. Nothing removes an entry while the flow
run lasts, and the parent `rl_training` flow run lasts the whole training run: ~7 entries an iteration, ~90% of
the objects the driver gained per iteration (measured in process, bench conditions, 160 micro iterations: ~21
objects an iteration, under 1 with the entries pruned). An entry whose object is gone, or that keeps no weak
reference to its object (a dict, list or tuple, looked up by `id` alone, which a new object may reuse), can
never draw a correct arrow again; those are dropped. Entries of objects still alive (the run state passed to the
next iteration's subflow) stay.
"""
from __future__ import annotations

import functools
import threading
from typing import Any


def stopped_service(call: Any) -> bool:
    """Whether `call` (a partial, or Prefect's Call, around a bound method) belongs to a stopped service."""
    function = call.func if isinstance(call, functools.partial) else getattr(call, "fn", None)
    owner = getattr(function, "__self__", None)
    return getattr(owner, "_stopped", False) is True and hasattr(owner, "_queue")


def release_stopped_services() -> int:
    """Drop every exit-time call of a stopped Prefect service; the number dropped."""
    dropped = 0
    exits = getattr(threading, "_threading_atexits", None)
    if isinstance(exits, list):
        kept = [call for call in exits if not stopped_service(call)]
        dropped += len(exits) - len(kept)
        exits[:] = kept
    try:
        from prefect._internal.concurrency.threads import get_global_loop

        loop_thread = get_global_loop()
    except Exception:  # noqa: BLE001 - another Prefect: nothing to release
        return dropped
    calls = getattr(loop_thread, "_on_shutdown", None)
    if isinstance(calls, list):
        with getattr(loop_thread, "_lock", threading.Lock()):
            kept = [call for call in calls if not stopped_service(call)]
            dropped += len(calls) - len(kept)
            calls[:] = kept
    return dropped


def forget_dead_results() -> int:
    """Drop the current flow run's dependency-tracking entries whose result is gone or untracked by a weak
    reference; the number dropped (0 outside a flow run, or in a Prefect without `run_results`)."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    results = getattr(context, "run_results", None)
    if not isinstance(results, dict):
        return 0
    dead = [key for key, entry in results.items()
            if not (isinstance(entry, tuple) and len(entry) == 3 and entry[2] is not None and entry[2]() is not None)]
    for key in dead:
        del results[key]
    return len(dead)
