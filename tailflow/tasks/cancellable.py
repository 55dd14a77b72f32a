"""The training run's tasks, made so that a Cancel stops them without an error.

Prefect 3 logs every end of a task run but Completed at ERROR ("Task run failed with exception", "Crash
detected!", "Task run was aborted"). A Cancel's signal (driver/cancel.py) lands wherever the driver is, most
often in a task's body: Ray's SIGTERM handler raises SystemExit there, or, inside Ray's C code, a SystemError
(seen in the Cancel test: `train_policy` "failed" while nothing had). So the UI showed an error for a Cancel.
A `run_task`'s body that stops while the run is being cancelled returns `STOPPED` instead (its task run ends
Completed), and calling the task raises `RunCancelled` in the flow that called it, which ends the iteration
and the run Cancelled with the run's one line (driver/cancel.py). Any other error passes unchanged.
"""
from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from prefect import Task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import Abort


class RunCancelled(Abort):
    """The run's flow run was cancelled; the message is the line the run wrote. `state` (when set): the flow
    run's Cancelled state, which Prefect's engine records as the run's end."""


def cancel_requested() -> bool:
    """Whether the run this flow run belongs to (its root flow run) is Cancelling or Cancelled. False when the
    API cannot say: the error at hand is then reported as it is. Once it says yes the run winds down, so from
    then on this process ignores SIGTERM (`hold_off_termination`).

    While it asks, SIGTERM waits (`deferred_termination`). It is asked about an error the Cancel's signal may
    have caused before the signal itself is handled in the driver (Ray's processes die of it too); raised inside
    the question, the signal escaped the handling that ends the run Cancelled."""
    with deferred_termination() as deferred:
        cancelling = run_is_cancelling()
        if cancelling:
            deferred.drop()
            hold_off_termination()
    return cancelling


def run_is_cancelling() -> bool:
    """The API's answer for the root flow run of this flow run; False when it has none (no flow run, or an
    error asking)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    if not flow_run.id:
        return False
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run.root_flow_run_id or flow_run.id).state
    except Exception:  # noqa: BLE001 - see cancel_requested
        return False
    return state is not None and (state.is_cancelling() or state.is_cancelled())


class DeferredTermination:
    """A SIGTERM that arrived while deferred: the handler it replaced gets it on `resume` (re-delivered),
    unless `drop`ped because the run is known to be cancelled and winds down by itself."""

    def __init__(self) -> None:
        self.previous: Any = None
        self.installed = False
        self.received = False
        self.dropped = False

    def record(self, signum: int, frame: Any) -> None:
        self.received = True

    def drop(self) -> None:
        self.dropped = True

    def resume(self) -> None:
        if not self.installed or self.dropped:
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL if self.previous is None else self.previous)
        if self.received:
            os.kill(os.getpid(), signal.SIGTERM)  # lands in the restored handler, as if it came just now


@contextmanager
def deferred_termination() -> Iterator[DeferredTermination]:
    """SIGTERM recorded instead of handled for the block, then handed to the handler it replaced. Only the
    main thread can set a handler; from another nothing is deferred."""
    deferred = DeferredTermination()
    if threading.current_thread() is threading.main_thread():
        deferred.previous = signal.signal(signal.SIGTERM, deferred.record)
        deferred.installed = True
    try:
        yield deferred
    finally:
        deferred.resume()


def hold_off_termination() -> None:
    """Once the run knows it is being cancelled it winds down by itself (says its line, sets its states, lets its
    lease go), and the worker's SIGTERM must not raise SystemExit in the middle of that: seen in the Cancel test,
    where the run had noticed the Cancel between two iterations and the signal landed in the lease's release,
    leaving the run Crashed. Ray's processes still get the signal and exit. Only the main thread can set a
    handler (the flow's, where the signal is delivered); from another nothing changes. Prefect's engine puts
    the handler it replaced back when a subflow ends, so the parent holds off again (driver/cancel.py)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


@contextmanager
def exits_on_sigterm() -> Iterator[None]:
    """Inside: SIGTERM raises SystemExit, as Ray's driver handler does (`ray.init` installs it), the one signal
    exception Ray's blocking calls pass on at once. A subflow's engine (Prefect 3.8.8's `capture_sigterm`)
    replaces Ray's handler with its own, whose exception a `ray.get` holds until its result comes: seen in the
    Cancel test, where the signal landed in `take_round`'s `ray.get` while the same signal stopped Ray's
    processes, the result never came, and the runner SIGKILLed the driver 30 s later, its iteration left Running
    and its line unsaid. Outside, the handler found is put back, unless the run has since held off termination
    (`hold_off_termination`). Only the main thread can set a handler; from another nothing changes."""
    held_off = signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    if threading.current_thread() is not threading.main_thread() or held_off:
        yield
        return
    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is exit_on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def exit_on_sigterm(signum: int, frame: Any) -> None:
    sys.exit(signum)


class Stopped:
    """What a task body stopped by a Cancel returns (never seen outside `CancellableTask.__call__`)."""

    def __repr__(self) -> str:
        return "STOPPED"


STOPPED = Stopped()


class CancellableTask(Task):
    """A Prefect task whose call raises `RunCancelled` where its body was stopped by a Cancel.

    SIGTERM waits while Prefect's engine starts and ends the task run (`engine_sigterm_deferred`): raised there,
    the engine logged "Crash detected!" at ERROR for a Cancel (seen in the Cancel test, the signal landing as
    `train_policy` began). Inside the body the flow's own handling applies (`flow_sigterm_inside`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with engine_sigterm_deferred():
            result = super().__call__(*args, **kwargs)
        if isinstance(result, Stopped):
            raise RunCancelled("the run is being cancelled")
        return result


ENGINE_DEFERRALS: list[DeferredTermination] = []
"""The SIGTERM deferrals of the task calls in progress in the main thread, innermost last."""


@contextmanager
def engine_sigterm_deferred() -> Iterator[None]:
    """Around a task run in Prefect's engine: a SIGTERM is recorded, then handed to the flow's handler, at the body's
    start (one that came while the run started) or after the run ended (one that came while it ended), where the
    flow's code stops on it; none is handed on once the run holds off termination (a Cancel it knows of)."""
    with deferred_termination() as deferred, in_progress(ENGINE_DEFERRALS, deferred):
        yield


@contextmanager
def in_progress(deferrals: list[DeferredTermination], deferred: DeferredTermination) -> Iterator[None]:
    """`deferred` innermost in `deferrals` for the block; dropped at its end if the code inside learnt of the Cancel
    (`cancel_requested` ignores SIGTERM from then on): the run winds down by itself."""
    deferrals.append(deferred)
    try:
        yield
    finally:
        deferrals.pop()
        if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
            deferred.drop()


@contextmanager
def flow_sigterm_inside() -> Iterator[None]:
    """In a task's body: SIGTERM handled by the flow's handler again, one recorded while the run started first."""
    deferred = ENGINE_DEFERRALS[-1] if ENGINE_DEFERRALS else None
    if deferred is None or signal.getsignal(signal.SIGTERM) != deferred.record:
        yield  # not called through CancellableTask, another thread, or someone else's handler meanwhile
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL if deferred.previous is None else deferred.previous)
    try:
        if deferred.received:
            deferred.received = False
            os.kill(os.getpid(), signal.SIGTERM)  # lands in the flow's handler, as if it came just now
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) != signal.SIG_IGN:  # unless the body held off termination
            signal.signal(signal.SIGTERM, deferred.record)


SUBFLOW_RETURNS: list[DeferredTermination] = []
"""The SIGTERM deferrals of the subflow calls in progress in the main thread, innermost last."""


@contextmanager
def subflow_end_deferred() -> Iterator[None]:
    """Around a subflow's call in its parent flow: a SIGTERM the subflow recorded once its work was kept
    (`deferred_to_return`) is handed to the parent's handler when the call returns, where the parent's code stops
    on it (driver/cancel.py: `ended_on_cancel`); none once the run holds off termination (a Cancel it knows of)."""
    deferred = DeferredTermination()
    if threading.current_thread() is threading.main_thread():
        deferred.previous, deferred.installed = signal.getsignal(signal.SIGTERM), True
    try:
        with in_progress(SUBFLOW_RETURNS, deferred):
            yield
    finally:
        deferred.resume()


def deferred_to_return() -> None:
    """In a subflow called in `subflow_end_deferred`, once its work is kept (the iteration committed): SIGTERM
    recorded from here until the call returns to the parent. Prefect's engine ends the subflow run after the body
    returns, under its own handler (Prefect 3.8.8's `capture_sigterm`), and a signal landing there without the
    runner's cancel intent was reported as a crash: seen in the Cancel test, "Crash detected! Execution was
    aborted by a termination signal." at ERROR for a committed iteration. The recorder stays installed past the
    body (`exits_on_sigterm` leaves a handler it did not set) until the engine puts back the parent's handler or
    the parent does (`subflow_end_deferred`). Nothing changes once the run holds off termination, outside a
    `subflow_end_deferred` call, or from another thread."""
    deferred = SUBFLOW_RETURNS[-1] if SUBFLOW_RETURNS else None
    if (deferred is None or not deferred.installed or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) == signal.SIG_IGN):
        return
    signal.signal(signal.SIGTERM, deferred.record)


def run_task(fn: Callable) -> CancellableTask:
    """`fn` as a never-cached task (each drives stateful Ray actors) that a Cancel stops quietly."""

    @functools.wraps(fn)
    def body(*args: Any, **kwargs: Any) -> Any:
        try:
            with flow_sigterm_inside():
                return fn(*args, **kwargs)
        except BaseException as error:
            if isinstance(error, RunCancelled) or not cancel_requested():
                raise
            return STOPPED

    return CancellableTask(fn=body, cache_policy=NO_CACHE, persist_result=False)
