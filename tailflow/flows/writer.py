"""The run's single writer, for every entry point: `tailflow train`, `tailflow resume` and the flow itself.

All three run the `rl_training` flow, which holds the run's store lease
(engines/runs/lease.py) from before its first write to the run until it
returns. The lease lives in the store, not in Prefect, so it guards CLI runs
on the ephemeral server, flow runs from a deployment and a mix of both alike.

Crashed means crashed: a flow run whose process was killed cannot report its
own end, so Prefect shows it Running for ever. The lease names the flow run
that holds it; when a later flow run takes a lease whose holder is dead, it
marks that flow run Crashed (unless it is this same flow run, retried).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from tailflow.config import RunConfig
from tailflow.engines.runs.lease import HeldLease, Lease, hold_lease
from tailflow.engines.store import open_store
from tailflow.flows.run_log import say


def holder_name() -> str:
    """What a refused writer is told holds the run: this flow run, by name and id."""
    from prefect.runtime import flow_run

    return f"flow run {flow_run.name} ({flow_run.id})" if flow_run.id else "tailflow"


@contextmanager
def run_writer(run_config: RunConfig, run_id: str, take_over: bool = False) -> Iterator[HeldLease]:
    from prefect.runtime import flow_run

    own_id = str(flow_run.id) if flow_run.id else None
    with hold_lease(open_store(run_config.storage.uri), run_id, holder_name(), take_over, own_id) as lease:
        if lease.taken_from is not None:
            mark_crashed(lease.taken_from, own_id)
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
