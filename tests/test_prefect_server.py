"""Prefect's own server answers the list calls that the UI, `prefect deploy` and our tools make.

With fastapi 0.151-0.154, prefect 3.8.8's server answered 422 to every list call whose `limit` is null (the
client's default), so `read_flow_runs()`, `read_deployments()`, `read_artifacts()`, `read_work_pools()` and
`prefect deploy` failed while the server looked healthy. pyproject.toml pins fastapi below 0.151; this test
catches a resolver that drifts past it.
"""
from __future__ import annotations

import pytest
from prefect_server import api, running_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    try:
        with running_server(tmp_path_factory.mktemp("prefect-list-calls")) as running:
            yield running
    except RuntimeError as error:
        pytest.fail(str(error))


def test_list_calls_with_default_arguments_answer(server):
    from prefect.client.orchestration import get_client

    with api(server), get_client(sync_client=True) as client:
        assert client.read_flow_runs() == []
        assert client.read_deployments() == []
        assert client.read_artifacts() == []
        assert isinstance(client.read_work_pools(), list)
