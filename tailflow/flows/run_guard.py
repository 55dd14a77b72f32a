"""One writer per run id: a Prefect global concurrency limit named after the run, held for the whole run.

Two flow runs for the same run id (two triggers from the UI or API, a
schedule firing while the last resume still runs, a Retry clicked twice)
would interleave metrics rows and race on `latest.json`. Each `rl_training`
flow run started by a deployment therefore holds the limit `tailflow-run-<id>`
(created on demand with one slot): the second waits up to
`RUN_SLOT_WAIT_S`, then fails with the holder's name instead of writing.

The slot is a lease the client renews in the background; if the process
holding it is killed, the slot frees when the lease runs out
(`LEASE_DURATION_S`). Runs started from the CLI (`tailflow train` /
`resume`, Prefect's ephemeral server) take no slot: a killed CLI run must
resume at once, and two people resuming one run id by hand is not guarded
(see docs/operations.md).
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Iterator

from tailflow.config import ConfigError

RUN_SLOT_WAIT_S = 60.0
LEASE_DURATION_S = 60.0


class RunBusyError(ConfigError):
    """Another flow run holds this run id's slot (no retry: the other run is doing the work)."""


def limit_name(run_id: str) -> str:
    return f"tailflow-run-{run_id}"


def ensure_limit(name: str) -> None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(name, limit=1)


@contextmanager
def hold_run_slot(run_id: str, wait_s: float = RUN_SLOT_WAIT_S) -> Iterator[None]:
    from prefect.concurrency.sync import concurrency

    name = limit_name(run_id)
    ensure_limit(name)
    try:
        slot = concurrency(name, occupy=1, timeout_seconds=wait_s, lease_duration=LEASE_DURATION_S, strict=True)
        slot.__enter__()
    except TimeoutError:
        raise RunBusyError(f"run {run_id} is being written by another flow run (concurrency limit {name} is held); "
                           f"waited {wait_s:.0f}s. Wait for it to finish, or cancel it, then resume") from None
    try:
        yield
    finally:
        slot.__exit__(None, None, None)


def run_slot(run_id: str):
    """The slot for deployment-triggered flow runs; nothing for CLI runs (see the module docstring)."""
    from prefect.runtime import deployment

    if deployment.id:
        return hold_run_slot(run_id)
    return nullcontext()
