"""The run's single writer, for every entry point: `tailflow train`, `tailflow resume` and the flow itself.

All three run the `rl_training` flow, which holds the run's store lease
(engines/runs/lease.py) from before its first write to the run until it
returns. The lease lives in the store, not in Prefect, so it guards CLI runs
on the ephemeral server, flow runs from a deployment and a mix of both alike.

Crashed means crashed (docs/operations.md#one-writer-per-run): the flow run
that takes the lease marks the holder's flow run Crashed, and every iteration
subflow still Running under either. Crashing the subflow's tracking task run
as well keeps a retried parent from reattaching a later iteration to it
(Prefect reuses a subflow whose tracking task run is not final).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from tailflow.config import RunConfig
from tailflow.driver.run_log import say, warnings_in_run_logs
from tailflow.driver.subflows import subflows_of
from tailflow.engines.runs.lease import HeldLease, Lease, hold_lease
from tailflow.engines.store import open_store


@contextmanager
def run_writer(run_config: RunConfig, run_id: str, take_over: bool = False) -> Iterator[HeldLease]:
    from prefect.runtime import flow_run

    own_id = str(flow_run.id) if flow_run.id else None
    holder = f"flow run {flow_run.name} ({own_id})" if own_id else "tailflow"  # what a refused writer is told
    with (warnings_in_run_logs(own_id),
          hold_lease(open_store(run_config.storage.uri), run_id, holder, take_over, own_id) as lease):
        if lease.taken_from is not None:
            mark_crashed(lease.taken_from, own_id)
        if own_id is not None:
            previous = lease.taken_from.flow_run_id if lease.taken_from is not None else None
            end_orphaned_iterations(run_id, {own_id, previous} - {None}, f"{flow_run.name} ({own_id})")
        yield lease


def mark_crashed(previous: Lease, own_id: str | None) -> None:
    """Set the previous holder's flow run Crashed, if it still claims to run (and is not this flow run)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Crashed

    if previous.flow_run_id is None or previous.flow_run_id == own_id:
        return
    with get_client(sync_client=True) as client:
        try:
            run = client.read_flow_run(previous.flow_run_id)
        except ObjectNotFound:  # another Prefect server (e.g. an ephemeral one of a CLI run)
            return
        if run.state is None or run.state.is_final():
            return
        message = (f"its process (pid {previous.pid} on {previous.host}) stopped without reporting; "
                   f"run {previous.run_id} was taken over by flow run {own_id}")
        client.set_flow_run_state(run.id, Crashed(message=message), force=True)
    say(f"[tailflow] run {previous.run_id}: marked flow run {run.name} ({run.id}) Crashed: {message}")


def end_orphaned_iterations(run_id: str, parent_ids: set[str], replaced_by: str) -> None:
    """Set Crashed every iteration subflow of `parent_ids` that is not final, with its tracking task run and the
    tasks still running inside it. Called before this attempt runs any iteration, so whatever is not final is an
    earlier attempt's."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilterStateType
    from prefect.client.schemas.objects import TERMINAL_STATES

    orphans = subflows_of(sorted(parent_ids), FlowRunFilterStateType(not_any_=list(TERMINAL_STATES)))
    ended = []
    with get_client(sync_client=True) as client:
        for orphan in orphans:
            message = (f"{orphan.name} of run {run_id} stopped without reporting (its process was killed); "
                       f"the run was resumed from its last commit by flow run {replaced_by}")
            crash_with_tasks(client, orphan, message)
            ended.append(orphan.name)
    for name in ended:
        say(f"[tailflow] run {run_id}: marked {name} of the earlier attempt Crashed (replaced by {replaced_by})")


def crash_with_tasks(client, orphan, message: str) -> None:
    """`orphan` (a flow run), its tracking task run in the parent, and its task runs that are not final: Crashed."""
    from prefect.client.schemas.filters import (TaskRunFilter, TaskRunFilterFlowRunId, TaskRunFilterState,
                                                TaskRunFilterStateType)
    from prefect.client.schemas.objects import TERMINAL_STATES
    from prefect.states import Crashed

    client.set_flow_run_state(orphan.id, Crashed(message=message), force=True)
    inside = TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[orphan.id]),
                           state=TaskRunFilterState(type=TaskRunFilterStateType(not_any_=list(TERMINAL_STATES))))
    task_run_ids = [task_run.id for task_run in client.read_task_runs(task_run_filter=inside)]
    if orphan.parent_task_run_id is not None:
        task_run_ids.append(orphan.parent_task_run_id)
    for task_run_id in task_run_ids:
        client.set_task_run_state(task_run_id, Crashed(message=message), force=True)
