"""A run's progress lines: on the terminal as plain lines, and in Prefect's logs of the flow run they belong to.

`print` reaches neither the Logs tab of a flow run (FACTS.md) nor, with the CLI's
quiet Prefect defaults (PREFECT_LOGGING_LEVEL=WARNING), does an INFO record
from `get_run_logger()` pass Prefect's own loggers. So the lines go through a
logger of ours, `tailflow.run`, at INFO: one handler prints the bare line to
stdout, the other is Prefect's APILogHandler, which files each record under
the current flow run (or the `flow_run_id` given, e.g. an iteration's subflow).
"""
from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from typing import Any, Iterator
from uuid import UUID

from tailflow.driver.prefect_outage import is_prefect_outage

LOGGER_NAME = "tailflow.run"


class InRunOnly(logging.Filter):
    """Send to the API only what belongs to a flow run (outside one, Prefect's handler would raise)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "flow_run_id", None):
            return True
        from prefect.context import FlowRunContext, TaskRunContext

        return FlowRunContext.get() is not None or TaskRunContext.get() is not None


class Stdout(logging.Handler):
    """The bare line to whatever `sys.stdout` is now (rich's live display swaps it to draw lines above itself).
    Lines filed under another flow run (an iteration's copy of a line) are not printed twice."""

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "api_only", False):
            return
        try:
            sys.stdout.write(self.format(record) + "\n")
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - logging must not break the run
            self.handleError(record)


def run_logger() -> logging.Logger:
    logger = logging.getLogger(LOGGER_NAME)
    if not logger.handlers:
        from prefect.logging.handlers import APILogHandler

        api = APILogHandler()
        api.addFilter(InRunOnly())
        logger.addHandler(Stdout())
        logger.addHandler(api)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


class ToRunLogs(logging.Handler):
    """Files each record under one flow run: for loggers used off the flow's thread (the lease heartbeat)."""

    def __init__(self, flow_run_id: str):
        super().__init__(logging.WARNING)
        self.flow_run_id = flow_run_id

    def emit(self, record: logging.LogRecord) -> None:
        try:
            say(f"[tailflow] {record.getMessage()}", flow_run_id=self.flow_run_id, level=record.levelno)
        except Exception:  # noqa: BLE001 - logging must not break the run
            self.handleError(record)


WARNING_LOGGERS = ("tailflow.lease", "tailflow.store")
"""Loggers of engines/ whose warnings belong in a run's logs: its lease, its store."""


@contextmanager
def warnings_in_run_logs(flow_run_id: str | None) -> Iterator[None]:
    """While inside, WARNING and above of `WARNING_LOGGERS` also go to flow run `flow_run_id`'s logs (the UI's
    Logs tab), from whatever thread logs them; they reach the terminal as before."""
    if flow_run_id is None:
        yield
        return
    handler = ToRunLogs(flow_run_id)
    for name in WARNING_LOGGERS:
        logging.getLogger(name).addHandler(handler)
    try:
        yield
    finally:
        for name in WARNING_LOGGERS:
            logging.getLogger(name).removeHandler(handler)


def flow_run_run_id(flow_run_id: UUID | str) -> str:
    """The run id of a flow run started without one: `run-` and the first 8 characters of the flow run's id, the
    same on every retry of that flow run (the flow names its run so; the Cancel hook finds the run by it)."""
    return f"run-{str(flow_run_id)[:8]}"


def say(line: str, flow_run_id: UUID | str | None = None, level: int = logging.INFO) -> None:
    """One progress line to the terminal and to the current flow run's logs (or `flow_run_id`'s only)."""
    extra: dict[str, Any] = {"flow_run_id": str(flow_run_id), "api_only": True} if flow_run_id else {}
    run_logger().log(level, line, extra=extra)
    for handler in run_logger().handlers:
        handler.flush()


def iteration_flow_run_id(iteration: int) -> UUID | None:
    """The newest `iter-NNNN` subflow run of this flow run (an iteration run again has several); None when the
    Prefect server does not answer (the line then goes to the run's log only)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, FlowRunFilterParentFlowRunId
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.runtime import flow_run

    if not flow_run.id:
        return None
    runs_filter = FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run.id]),
                                name=FlowRunFilterName(any_=[f"iter-{iteration:04d}"]))
    try:
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(flow_run_filter=runs_filter, sort=FlowRunSort.START_TIME_DESC, limit=1)
    except Exception as error:  # noqa: BLE001 - an outage only; anything else is raised
        if not is_prefect_outage(error):
            raise
        return None
    return runs[0].id if runs else None


def print_resume(ctx, state) -> None:
    say(f"[tailflow] run {ctx.run_id}: resuming after iteration {state.iteration - 1:04d} "
        f"(checkpoint {state.latest_checkpoint or 'initial model'}, {len(state.tail.queue)} prompts queued)")


def print_start(ctx, state) -> None:
    skipped = f" ({ctx.num_skipped_rows} invalid rows skipped)" if ctx.num_skipped_rows else ""
    say(f"[tailflow] run {ctx.run_id}: {len(ctx.train_problems)} train / {len(ctx.eval_problems)} eval problems"
        f"{skipped}, initial greedy accuracy {state.initial_eval_accuracy:.1%}")


def progress_line(row: dict[str, Any]) -> str:
    evaluated = f" | eval {row['eval/accuracy']:.1%}" if row.get("eval/accuracy") is not None else ""
    turns = f" | turns mean {row['env/turns_mean']:.1f}" if row.get("env/turns_mean") is not None else ""
    return (f"[tailflow] iter {row['iteration']:04d} | step {row['time/step_total']:.1f}s "
            f"(gen {row['time/step_generate']:.1f}s, train {row['time/step_train']:.1f}s) | "
            f"reward {row['reward/mean']:.3f} | len mean {row['token/response_length/mean']:.0f} "
            f"max {row['token/response_length/max']}{turns}{evaluated}")


@contextmanager
def tolerated(what: str) -> Iterator[None]:
    """Run a Prefect call whose loss costs nothing but what the UI shows (an artifact): if the server does not
    answer (`prefect_outage.is_prefect_outage`), say so and go on."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - only outages are swallowed, anything else is raised again
        if not is_prefect_outage(error):
            raise
        say(f"[tailflow] the Prefect server did not answer ({type(error).__name__}); {what} skipped")
