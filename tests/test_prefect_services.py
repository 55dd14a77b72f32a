"""driver/prefect_services.py: prefect 3.8.8 keeps every stopped client service through its exit-time calls (in a
run's driver, an events worker per flow run or so: ~3.3 MB an iteration); the release lets them go."""
from __future__ import annotations

import gc
import weakref

from tailflow.driver.prefect_services import release_stopped_services


def test_a_stopped_events_worker_is_kept_by_prefect_until_released(prefect_api):
    """A real EventsWorker, started by an event as Prefect starts it, then drained (as a flow run's end does):
    Prefect's exit-time calls still hold it; after the release nothing does."""
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker

    emit_event(event="tailflow.test", resource={"prefect.resource.id": "tailflow.test"})
    worker = EventsWorker.instance()
    worker.drain()
    assert worker._stopped
    alive = weakref.ref(worker)
    del worker
    gc.collect()
    assert alive() is not None  # the leak: a stopped service, still referenced
    assert release_stopped_services() >= 1
    gc.collect()
    assert alive() is None
    assert release_stopped_services() == 0  # nothing stopped is left to release
