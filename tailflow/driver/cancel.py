"""Cancel (the UI's button, `prefect flow-run cancel`): the run stops, says what is committed and how to go on,
and its flow run and the iteration it was in end Cancelled.

A worker cancels a flow run by SIGTERMing its process group: the driver gets SystemExit (Ray's SIGTERM handler,
which, unlike Prefect's, its blocking calls pass on cleanly) and Ray's processes, in the same group, exit, so a
Ray call in flight may fail first. Whatever error reaches the iteration or the run's loop, when the run's flow
run is Cancelling the run writes one line (iterations committed, the checkpoint, how to resume), sets the
iteration's subflow and its own flow run Cancelled, and stops with `RunCancelled`. That is Prefect's `Abort`
("the orchestrator ended this run"): the engines then neither report a crash nor propose a state of their
own, and no retry starts. A task the signal stops ends Completed and its call raises `RunCancelled`
(tasks/cancellable.py): Prefect logs every other end of a task run as an error. A flow run no worker supervises
(`tailflow train` with a server) is cancelled too: the run looks at its state after each commit and stops there.

Where SIGTERM lands decides whether that handling runs to its end. A subflow's engine (Prefect 3.8.8's
`capture_sigterm`) replaces Ray's handler with its own while the subflow runs, and a `ray.get` holds that one's
exception until its result comes, which, Ray's processes stopped by the same signal, it may never do: the
runner then SIGKILLed the driver 30 s later (seen in the Cancel test: the iteration left Running, the line
unsaid). So an iteration's own code runs with SIGTERM raising SystemExit, as Ray's handler does
(`aborted_on_cancel`). The subflow's engine puts Ray's handler back when it ends, undoing the ignore a task set,
so the run ignores SIGTERM again as soon as the error that reaches it says it is cancelled (`ended_on_cancel`),
and while it asks the API the signal waits (tasks/cancellable.py): a second SIGTERM (Prefect's engine sends one
to its own process when the first came without the runner's cancel intent; a runner sends one per cancellation
it acts on) must not stop that handling halfway. From an iteration's commit until its subflow returns the signal
waits (`deferred_to_return`): landing in the subflow engine's end it was reported as a crash; it stops the run in
its flow instead, after the committed iteration. Should the process die anyway, the runner runs
`end_left_subflows`, which says the line if the process did not and ends the iteration it left Running.
"""
from __future__ import annotations

from contextlib import contextmanager
from datetime import datetime
from typing import Iterator

from tailflow.driver.run_log import flow_run_run_id, say
from tailflow.driver.subflows import force_state, iteration_of, subflows_of, unfinished_since
from tailflow.engines.runs.commit import read_committed_state
from tailflow.tasks.cancellable import RunCancelled, cancel_requested, exits_on_sigterm, hold_off_termination


def cancelled_line(committed, run_id: str, store_uri: str, iteration: int, finished: bool) -> str:
    """What the run says when cancelled in (or, `finished`, after) `iteration`, `committed` its last commit (None
    before the first): what is committed, how to go on."""
    done = committed_count(committed)
    checkpoint = committed.latest_checkpoint if committed is not None else None
    where = (f"after iteration {iteration:04d}" if finished or done > iteration
             else f"in iteration {iteration:04d} (nothing of it is kept)")
    return (f"[tailflow] run {run_id}: cancelled {where}; {done} iterations committed "
            f"(checkpoint {checkpoint or 'none: the initial model'}); to continue from there: "
            f"`tailflow resume {run_id} --set storage.uri={store_uri}`, Retry on this flow run, or the "
            f"rl-training deployment with run_id {run_id}")


def stop_if_cancelled(store, run_id: str, store_uri: str, iteration: int) -> None:
    """Between iterations: end the run here if its flow run was cancelled."""
    if cancel_requested():
        line = cancelled_line(read_committed_state(store, run_id), run_id, store_uri, iteration, finished=True)
        say(line)
        raise run_cancelled(line)


@contextmanager
def ended_on_cancel(store, run_id: str, store_uri: str, iteration: int, since: datetime) -> Iterator[None]:
    """Around iteration `iteration` in the run's flow: whatever stops it while the run is being cancelled
    becomes the run's line, a Cancelled subflow and flow run, and RunCancelled; any other error passes. From the
    moment it knows, SIGTERM is ignored: a RunCancelled from the subflow says so, and the subflow's engine put
    Ray's handler back on its way out. A SIGTERM landing while the line is written or the subflows ended stopped
    the run there, its iteration left Running."""
    try:
        yield
    except BaseException as error:
        if isinstance(error, RunCancelled) and getattr(error, "state", None) is not None:
            raise  # stop_if_cancelled ended the run already, its line said
        if isinstance(error, RunCancelled):
            hold_off_termination()  # the subflow's engine put back the handler it had replaced (Ray's)
        elif not cancel_requested():
            raise
        committed = read_committed_state(store, run_id)
        line = cancelled_line(committed, run_id, store_uri, iteration, finished=False)
        say(line)
        cancel_unfinished_subflows(since, line, committed_count(committed))
        raise run_cancelled(line) from None


@contextmanager
def aborted_on_cancel() -> Iterator[None]:
    """Inside an iteration's subflow: an error while the run is being cancelled stops the subflow without a
    crash report (the run's flow then ends it Cancelled, `ended_on_cancel`). Inside, SIGTERM raises SystemExit
    (`exits_on_sigterm`), so that the Cancel's signal stops a Ray call in flight instead of waiting on it."""
    with exits_on_sigterm():
        try:
            yield
        except BaseException as error:
            if isinstance(error, RunCancelled) or not cancel_requested():
                raise
            raise RunCancelled("the run is being cancelled") from None


def run_cancelled(line: str) -> RunCancelled:
    """This flow run set Cancelled (with `line`), and the exception that ends it there."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run
    from prefect.states import Cancelled

    cancelled = RunCancelled(line)
    if flow_run.id:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run.id, Cancelled(message=line), force=True)
            cancelled.state = client.read_flow_run(flow_run.id).state
    return cancelled


def committed_count(committed) -> int:
    """How many iterations a run whose last commit is `committed` has committed (0: None, before its first)."""
    return committed.iteration if committed is not None else 0


def cancel_unfinished_subflows(since: datetime, line: str, committed: int) -> None:
    """End every subflow this flow run started after `since` (this attempt) unless it completed: the one the
    signal stopped, one Prefect's engine set Cancelled ("Flow run was cancelled."), and any other it left Crashed
    or Running on the way (a subflow's engine reports the signal as a crash when it lands outside the iteration's
    own code; one it hit while starting still has its generated name, not `iter-NNNN`). Subflows of earlier
    attempts keep their states (a killed attempt's Crashed one says what replaced it). One whose iteration is
    among the `committed` ones (the signal landed between its commit and its end) ends Completed, as its work is
    kept; the others end Cancelled."""
    end_subflows(unfinished_since(since), line, committed)


def end_subflows(subflows: list, line: str, committed: int) -> None:
    """Each of `subflows` Completed if its iteration is below `committed`, else Cancelled; `line` the message."""
    iterations = [iteration_of(subflow) for subflow in subflows]
    kept = [subflow for subflow, iteration in zip(subflows, iterations)
            if iteration is not None and iteration < committed]
    set_state(kept, line, cancelled=False)
    set_state([subflow for subflow in subflows if subflow not in kept], line, cancelled=True)


def set_state(flow_runs: list, line: str, cancelled: bool) -> None:
    """Force each of `flow_runs` Cancelled (or Completed: its iteration committed), with the run's line as the
    state's message."""
    from prefect.states import Cancelled, Completed

    force_state(flow_runs, Cancelled(message=line) if cancelled else
                Completed(message=f"committed before the Cancel; {line}"))


def end_left_subflows(flow, flow_run, state) -> None:
    """`rl_training`'s on_cancellation hook. A worker's runner (Prefect 3.8.8: runner/_cancellation_manager.py)
    runs it in a process of its own once the Cancel's signal has ended the run's process (or its SIGKILL, 30 s
    later), before it sets the flow run Cancelled. Where the process could not end the run itself (it died
    before `ended_on_cancel` or `stop_if_cancelled` got there) the run's line is said here, and a subflow still
    Pending or Running, one the process could not end, is set Cancelled with it. Crashed ones are left: an
    earlier attempt's, ended by the resume that replaced it. Where the run ended itself (the usual case) there is
    nothing to do. One whose iteration committed ends Completed, as `ended_on_cancel` ends it."""
    from prefect.client.schemas.filters import FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType

    subflows = subflows_of([flow_run.id], FlowRunFilterStateType(any_=[StateType.PENDING, StateType.RUNNING]))
    store, run_id, store_uri = run_store(flow_run)
    iterations = [iteration for iteration in map(iteration_of, subflows) if iteration is not None]
    committed = read_committed_state(store, run_id)
    line = said_or_say(flow_run, committed, run_id, store_uri, min(iterations) if iterations else None)
    end_subflows(subflows, line, committed_count(committed))


def run_store(flow_run) -> tuple:
    """(store, run id, store URI) of flow run `flow_run`, from its parameters as the flow resolves them."""
    from tailflow.config import flow_run_config
    from tailflow.engines.store import open_store

    params = flow_run.parameters
    store_uri = flow_run_config(params.get("config_path"), params.get("overrides") or [],
                                params.get("config")).storage.uri
    return open_store(store_uri), params.get("run_id") or flow_run_run_id(flow_run.id), store_uri


def said_or_say(flow_run, committed, run_id: str, store_uri: str, iteration: int | None) -> str:
    """The run's line, as `ended_on_cancel` says it, for flow run `flow_run` stopped in `iteration` (None: in
    the one after its last commit, `committed`): read back from its logs if its process said it, else said now,
    in its logs."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    with get_client(sync_client=True) as client:
        records = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id])),
                                   sort=LogSort.TIMESTAMP_DESC)  # the newest page: the line ends the run's logs
    said = [record.message for record in records if record.message.startswith(f"[tailflow] run {run_id}: cancelled ")]
    if said:
        return said[0]
    if iteration is None:
        iteration = committed_count(committed)
    line = cancelled_line(committed, run_id, store_uri, iteration, finished=False)
    say(line, flow_run_id=flow_run.id)
    return line
