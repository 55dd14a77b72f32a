"""What the parent flow does between iterations and at the end, beyond committing: say where the run is,
make sure it is still the run's writer, and keep the run report current.

Kept out of flows/training.py so the loop there reads as the steps it runs.
"""
from __future__ import annotations

from typing import Any

from tailflow.driver.cancel import stop_if_cancelled
from tailflow.driver.live_progress import LiveProgress
from tailflow.driver.run_log import iteration_flow_run_id, progress_line, say, tolerated
from tailflow.engines.runs.lease import HeldLease


def after_iteration(ctx, state, row: dict[str, Any], lease: HeldLease, live: LiveProgress) -> None:
    """After iteration `row["iteration"]` committed: its progress line (in the run's logs and the iteration's),
    the writer check, a Cancel asked for meanwhile, and the report every `tracking.report_every` iterations."""
    line = progress_line(row)
    say(line)
    subflow = iteration_flow_run_id(row["iteration"])
    if subflow is not None:
        say(line, flow_run_id=subflow)
    lease.check()
    if state.iteration < ctx.config.train.iterations:
        stop_if_cancelled(ctx.store, ctx.run_id, ctx.config.storage.uri, row["iteration"])
    live.iteration_done(state)
    every = ctx.config.tracking.report_every
    if every and state.iteration % every == 0 and state.iteration < ctx.config.train.iterations:
        publish_report(ctx)


def publish_report(ctx) -> None:
    """Redraw the report and the run's index; link it from the flow run (a link that opens: driver/links.py). A
    report is not worth a run: a failure to draw it is said, not raised.

    Its closed figures are freed through their reference cycles: the run's loop collects those after each
    iteration (driver/garbage.py; bench/report_memory.py measures a redraw with and without)."""
    from tailflow.engines.track.report import write_report
    from tailflow.driver.artifacts import artifact_key
    from tailflow.driver.links import StoredFile, publish_file_link

    try:
        report = write_report(ctx.store, ctx.run_id)
    except Exception as error:  # noqa: BLE001 - see the docstring
        say(f"[tailflow] run {ctx.run_id}: could not draw the report: {type(error).__name__}: {error}")
        return
    page = StoredFile(report.page, f"report of run {ctx.run_id}",
                      f"run {ctx.run_id}: plots after {report.iterations} iterations")
    with tolerated("the report's link artifact"):
        publish_file_link(ctx.store, page, f"{artifact_key(ctx.run_id)}-report", ctx.config.storage.link_expiry_s)
