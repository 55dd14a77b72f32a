"""A Prefect server that stops answering under a running flow: tell it from other failures, wait for it.

What an outage does to a run (measured with tests/prefect_server.py's `PrefectServer` stopped under a
`tailflow train` run, docs/operations.md "When the Prefect server goes away"): Prefect's client retries a
request to a server it has reached before for about a minute (5 retries, 2 s to 32 s apart), so a shorter
outage only pauses the run. A longer one makes a state change or an artifact fail with a connection error
inside the iteration's subflow. The run's truth is in its store, not in Prefect, so nothing is lost: the
iteration that failed is thrown away, and once the server answers again it runs again from the last commit
(`flows/training.run_iteration`), as after an actor's death. Artifacts are only what the UI shows: one that
cannot be published is skipped with a warning (`run_log.tolerated`), and the next iteration's replaces it. An
iteration the outage failed after its commit is kept, not run again, and its subflow, left Failed by the outage,
ends Completed (`complete_committed_subflow`).
"""
from __future__ import annotations

import time
import urllib.request
from datetime import datetime

import httpx

OUTAGE_WAIT_S = 3600.0
"""How long a run waits for its Prefect server to answer again before it fails (an operator restarting or
upgrading a server takes minutes; a server gone for an hour is a decision someone made)."""
POLL_S = 2.0


def is_prefect_outage(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is a request to the Prefect API that got no answer or a server
    error: a transport error (refused, reset, timed out) or a 5xx status."""
    from prefect.exceptions import PrefectHTTPStatusError

    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, httpx.TransportError):
            return True
        if isinstance(current, PrefectHTTPStatusError) and current.response.status_code >= 500:
            return True
        current = current.__cause__ or current.__context__
    return False


def api_health_url() -> str | None:
    """The server's /health (None when no API URL is set: Prefect's ephemeral server, which cannot go away on
    its own)."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    return f"{url.rstrip('/')}/health" if url else None


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def wait_for_prefect_api(timeout_s: float = OUTAGE_WAIT_S, poll_s: float = POLL_S) -> float:
    """Block until the Prefect API answers; the seconds waited. TimeoutError after `timeout_s`."""
    url = api_health_url()
    started = time.monotonic()
    if url is None:
        return 0.0
    while not answers(url):
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"the Prefect server ({url}) did not answer for {timeout_s:.0f} s")
        time.sleep(poll_s)
    return time.monotonic() - started


def complete_committed_subflow(step: int, since: datetime, line: str) -> int:
    """After an outage failed iteration `step` after its commit: its subflow, started at or after `since` (the
    try that failed), which the outage left Failed or Running, ends Completed with `line` as its message, as its
    work is kept (seen in tests/test_prefect_outage.py: `iter-0002` Failed, its iteration committed and not run
    again). The number of subflows set."""
    from prefect.states import Completed

    from tailflow.driver.subflows import force_state, iteration_of, unfinished_since

    tried = [run for run in unfinished_since(since) if iteration_of(run) == step]
    force_state(tried, Completed(message=line))
    return len(tried)
