"""The training run's tasks, made so that a Cancel stops them without an error.

Prefect 3 logs every end of a task run but Completed at ERROR ("Task run failed with exception", "Crash
detected!", "Task run was aborted"). A Cancel's signal (flows/cancel.py) lands wherever the driver is, most
often in a task's body: Ray's SIGTERM handler raises SystemExit there, or, inside Ray's C code, a SystemError
(seen in the Cancel test: `train_policy` "failed" while nothing had). So the UI showed an error for a Cancel.
A `run_task`'s body that stops while the run is being cancelled returns `STOPPED` instead (its task run ends
Completed), and calling the task raises `RunCancelled` in the flow that called it, which ends the iteration
and the run Cancelled with the run's one line (flows/cancel.py). Any other error passes unchanged.
"""
from __future__ import annotations

import functools
import signal
import threading
from typing import Any, Callable

from prefect import Task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import Abort


class RunCancelled(Abort):
    """The run's flow run was cancelled; the message is the line the run wrote. `state` (when set): the flow
    run's Cancelled state, which Prefect's engine records as the run's end."""


def cancel_requested() -> bool:
    """Whether the run this flow run belongs to (its root flow run) is Cancelling or Cancelled. False when the
    API cannot say: the error at hand is then reported as it is. Once it says yes the run winds down, so from
    then on this process ignores SIGTERM (`hold_off_termination`)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    if not flow_run.id:
        return False
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run.root_flow_run_id or flow_run.id).state
    except Exception:  # noqa: BLE001 - see the docstring
        return False
    cancelling = state is not None and (state.is_cancelling() or state.is_cancelled())
    if cancelling:
        hold_off_termination()
    return cancelling


def hold_off_termination() -> None:
    """Once the run knows it is being cancelled it winds down by itself (says its line, sets its states, lets its
    lease go), and the worker's SIGTERM must not raise SystemExit in the middle of that: seen in the Cancel test,
    where the run had noticed the Cancel between two iterations and the signal landed in the lease's release,
    leaving the run Crashed. Ray's processes still get the signal and exit. Only the main thread can set a
    handler (the flow's, where the signal is delivered); from another nothing changes."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


class Stopped:
    """What a task body stopped by a Cancel returns (never seen outside `CancellableTask.__call__`)."""

    def __repr__(self) -> str:
        return "STOPPED"


STOPPED = Stopped()


class CancellableTask(Task):
    """A Prefect task whose call raises `RunCancelled` where its body was stopped by a Cancel."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = super().__call__(*args, **kwargs)
        if isinstance(result, Stopped):
            raise RunCancelled("the run is being cancelled")
        return result


def run_task(fn: Callable) -> CancellableTask:
    """`fn` as a never-cached task (each drives stateful Ray actors) that a Cancel stops quietly."""

    @functools.wraps(fn)
    def body(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException as error:
            if isinstance(error, RunCancelled) or not cancel_requested():
                raise
            return STOPPED

    return CancellableTask(fn=body, cache_policy=NO_CACHE, persist_result=False)
