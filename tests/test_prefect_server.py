"""Prefect's own server answers the list calls that the UI, `prefect deploy` and our tools make.

With fastapi 0.151-0.154, prefect 3.8.8's server answered 422 to every list call whose `limit` is null (the
client's default), so `read_flow_runs()`, `read_deployments()`, `read_artifacts()`, `read_work_pools()` and
`prefect deploy` failed while the server looked healthy. pyproject.toml pins fastapi below 0.151; this test
catches a resolver that drifts past it.

It asks the session's Prefect server (`prefect_api`: Prefect's server app, the one `tailflow server` runs, in a
process of its own) rather than one of its own: a server start costs ~8 CPU-s here (2026-11-27), and what other
tests left on it changes only what the lists hold, not whether the calls answer.
"""
from __future__ import annotations


def test_list_calls_with_default_arguments_answer(prefect_api):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for read in (client.read_flow_runs, client.read_deployments, client.read_artifacts, client.read_work_pools):
            assert isinstance(read(), list), read.__name__  # a 422 raises instead
