"""One writer per run id: the second holder of a run's concurrency slot waits, then is refused by name."""
from __future__ import annotations

import threading
import time

import pytest


def test_second_holder_waits_then_is_refused_and_gets_the_slot_once_free(prefect_api):
    from tailflow.flows.run_guard import RunBusyError, hold_run_slot

    entered, release = threading.Event(), threading.Event()

    def first_writer():
        with hold_run_slot("guarded", wait_s=5):
            entered.set()
            release.wait(30)

    writer = threading.Thread(target=first_writer)
    writer.start()
    assert entered.wait(30)
    started = time.perf_counter()
    with pytest.raises(RunBusyError, match="run guarded is being written by another flow run"):
        with hold_run_slot("guarded", wait_s=2):
            pytest.fail("two holders of one run id")
    assert time.perf_counter() - started >= 1.5  # it waited before refusing
    with hold_run_slot("other-run", wait_s=2):  # other run ids are not blocked
        pass
    release.set()
    writer.join(30)
    with hold_run_slot("guarded", wait_s=10):  # freed when the first writer finished
        pass


def test_cli_runs_take_no_slot(prefect_api):
    from contextlib import nullcontext

    from tailflow.flows.run_guard import run_slot

    assert isinstance(run_slot("any"), nullcontext)  # no deployment: a killed CLI run must resume at once
