"""Which failures a retry of the `rl_training` flow run may fix.

The parent flow has `retries`: a crash of the driver's work (a store outage
that outlived boto's retries, a dead Ray node) is worth another attempt, which
resumes from the last commit. A wrong config or a refused resume is not: the
next attempt would fail the same way after the retry delay. Prefect decides
retries on the server from the flow run's policy, so before raising a user
error the flow sets that run's remaining retries to zero (a Retry from the UI
still works: that is a new decision by a person).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from tailflow.config import ConfigError
from tailflow.engines.data.dataset import DatasetError
from tailflow.engines.models import UnsupportedModelError
from tailflow.engines.runs.lease import LeaseLostError
from tailflow.engines.store import StoreAccessError

USER_ERRORS = (ConfigError, DatasetError, UnsupportedModelError, LeaseLostError, StoreAccessError)
"""Errors no retry can fix (LeaseLostError: another writer took the run; StoreAccessError: missing or refused
credentials, no permission, no such bucket). Any other StoreError is not one: an unreachable store may come
back."""


@contextmanager
def no_retry_on_user_error() -> Iterator[None]:
    try:
        yield
    except USER_ERRORS:
        cancel_remaining_retries()
        raise


def cancel_remaining_retries() -> None:
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    if not flow_run.id:
        return
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run.id)
        policy = run.empirical_policy.model_copy(update={"retries": 0})
        client.update_flow_run(flow_run_id=run.id, empirical_policy=policy)
