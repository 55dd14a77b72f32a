"""A training run's iteration subflows on the Prefect server: which iteration one ran, finding them, and setting
their state. Shared by the endings that set a subflow's state after the fact: a Cancel (driver/cancel.py), a
Prefect server outage (driver/prefect_outage.py) and an attempt that takes over the run (driver/writer.py)."""
from __future__ import annotations


def iteration_of(subflow) -> int | None:
    """The iteration an `iter-NNNN` subflow ran; None for one stopped before it was named."""
    number = (subflow.name or "")[len("iter-"):]
    return int(number) if (subflow.name or "").startswith("iter-") and number.isdigit() else None


def subflows_of(parent_flow_run_ids: list, states) -> list:
    """The subflow runs of any of `parent_flow_run_ids` whose state type `states` (a `FlowRunFilterStateType`)
    admits."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId, FlowRunFilterState

    runs_filter = FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=list(parent_flow_run_ids)),
                                state=FlowRunFilterState(type=states))
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=runs_filter)


def unfinished_since(since) -> list:
    """This flow run's subflows started at or after `since` (a `datetime`: an attempt's or a try's start) that did
    not complete: a Cancel or an outage left them Cancelled, Crashed, Failed or Running. The server leaves out
    completed ones (a long run has a finished subflow per iteration, more than a page of results); Cancelled ones
    stay in (Prefect's engine may have cancelled a committed one already). Empty outside a flow run."""
    from prefect.client.schemas.filters import FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType
    from prefect.runtime import flow_run

    if not flow_run.id:
        return []
    unfinished = subflows_of([flow_run.id], FlowRunFilterStateType(not_any_=[StateType.COMPLETED]))
    return [subflow for subflow in unfinished if subflow.created is not None and subflow.created >= since]


def force_state(flow_runs: list, state) -> None:
    """Set each of `flow_runs` to `state` (a Prefect `State`), forced past the server's orchestration rules: the
    run's store, not Prefect, says how an iteration ended."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for run in flow_runs:
            client.set_flow_run_state(run.id, state, force=True)
