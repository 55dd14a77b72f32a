"""What the parent flow does between iterations and at the end, beyond committing: say where the run is,
make sure it is still the run's writer, and keep the run report current.

Kept out of flows/training.py so the loop there reads as the steps it runs.
"""
from __future__ import annotations

from typing import Any
from uuid import UUID

from tailflow.engines.runs.lease import HeldLease
from tailflow.flows.live_progress import LiveProgress
from tailflow.flows.run_log import progress_line, say


def after_iteration(ctx, state, row: dict[str, Any], lease: HeldLease | None, live: LiveProgress | None) -> None:
    """After iteration `row["iteration"]` committed: its progress line (in the run's logs and the iteration's),
    the writer check, and the report every `tracking.report_every` iterations."""
    line = progress_line(row)
    say(line)
    subflow = iteration_flow_run_id(row["iteration"])
    if subflow is not None:
        say(line, flow_run_id=subflow)
    if lease is not None:
        lease.check()
    if live is not None:
        live.iteration_done(state)
    every = ctx.config.tracking.report_every
    if every and state.iteration % every == 0 and state.iteration < ctx.config.train.iterations:
        publish_report(ctx)


def after_run(ctx, state) -> None:
    publish_report(ctx)


def iteration_flow_run_id(iteration: int) -> UUID | None:
    """The newest `iter-NNNN` subflow run of this flow run (an iteration run again has several)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, FlowRunFilterParentFlowRunId
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.runtime import flow_run

    if not flow_run.id:
        return None
    runs_filter = FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run.id]),
                                name=FlowRunFilterName(any_=[f"iter-{iteration:04d}"]))
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=runs_filter, sort=FlowRunSort.START_TIME_DESC, limit=1)
    return runs[0].id if runs else None


def publish_report(ctx) -> None:
    """Redraw the report and the run's index; link it from the flow run. A report is not worth a run: a
    failure to draw it is said, not raised."""
    from prefect.artifacts import create_link_artifact

    from tailflow.engines.track.report import write_report
    from tailflow.flows.artifacts import artifact_key, browse_url

    try:
        report = write_report(ctx.store, ctx.run_id)
    except Exception as error:  # noqa: BLE001 - see the docstring
        say(f"[tailflow] run {ctx.run_id}: could not draw the report: {type(error).__name__}: {error}")
        return
    create_link_artifact(browse_url(ctx.store.uri(report.page)), link_text=f"report of run {ctx.run_id}",
                         key=f"{artifact_key(ctx.run_id)}-report",
                         description=f"run {ctx.run_id}: plots after {report.iterations} iterations")
