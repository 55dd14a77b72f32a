"""A schedule fires: Prefect's scheduler creates a run of a training deployment and a worker completes it.

With SQLAlchemy 2.1 (2.1.9 seen), prefect 3.8.8's scheduler service fails on every loop and creates no run, so
the `resume-every-6h` deployment, the multi-day story, silently does nothing; pyproject.toml pins
sqlalchemy<2.1 for it. This test is what the pin answers to: it fails with 2.1.9 (no run is ever created).
"""
from __future__ import annotations

import datetime as dt
import time

import pytest
from prefect_server import api, tiny_run, wait_final, wait_until

from tailflow.engines.runs.commit import read_committed_state
from tailflow.engines.store import LocalStore

pytestmark = pytest.mark.slow


def test_an_interval_schedule_creates_a_run_that_a_worker_completes(operated_prefect, tmp_path):
    """Costs ~123 s here (the schedule is due 30 s after it is made, the scheduler's loop creates the run, the
    worker picks it up, then a 1-iteration run with Ray and its actors; plus the session's `operated_prefect`
    server when this is the first test on its xdist worker to ask for it). Prefect's scheduler and worker set the
    pace, so nothing here can be made faster."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.schedules import IntervalSchedule
    from prefect.client.schemas.sorting import FlowRunSort

    parameters = {"run_id": "scheduled", "overrides": tiny_run(str(tmp_path), iterations=1)}
    with api(operated_prefect), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("rl_training/rl-training")  # as `tailflow deploy` made it
        created_at = time.time()
        # due in 30 s, then hourly: one run within the test (minutely ones start while the first still holds
        # the run's lease, which refuses them)
        first = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=30)
        (schedule,) = client.create_deployment_schedules(
            deployment.id, [(IntervalSchedule(interval=dt.timedelta(hours=1), anchor_date=first), True)],
            parameters=parameters, max_scheduled_runs=1)
    try:
        of_deployment = DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))

        def scheduled_run(client):  # the scheduler makes several ahead (an hour apart): the first is due now
            runs = client.read_flow_runs(deployment_filter=of_deployment, sort=FlowRunSort.EXPECTED_START_TIME_ASC)
            return next((run for run in runs if run.auto_scheduled), None)

        # the scheduler inserts a run ahead of its start time within seconds of its loop; not at all when broken
        run = wait_until(operated_prefect, scheduled_run, "a run created by the scheduler", timeout_s=240)
        assert run.parameters["run_id"] == "scheduled" and run.expected_start_time.timestamp() >= created_at
        started = lambda client: not client.read_flow_run(run.id).state.is_scheduled()  # noqa: E731
        wait_until(operated_prefect, started, "the scheduled run picked up by the worker", timeout_s=600)
    finally:
        with api(operated_prefect), get_client(sync_client=True) as client:
            client.delete_deployment_schedule(deployment.id, schedule.id)  # and the runs it scheduled after it
    (finished,) = wait_final(operated_prefect, [run.id])
    assert finished.state.is_completed(), finished.state.message
    assert finished.name == "scheduled"  # the flow run is named after the run id
    assert read_committed_state(LocalStore(tmp_path), "scheduled").iteration == 1
