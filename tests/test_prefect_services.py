"""driver/prefect_services.py: prefect 3.8.8 keeps every stopped client service through its exit-time calls (in a
run's driver, an events worker per flow run or so: ~3.3 MB an iteration), and a flow run keeps a dependency-tracking
entry for every result returned inside it; the release and the pruning let them go."""
from __future__ import annotations

import gc
import weakref

from dataclasses import dataclass

from tailflow.driver.prefect_services import forget_dead_results, release_stopped_services


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


@dataclass
class Held:
    value: int


def test_a_flow_run_forgets_the_results_that_are_gone_and_keeps_the_live_ones(prefect_api):
    """A real parent flow run calling a subflow four times, as `rl_training` calls each iteration's: each returns
    a tuple of a dataclass and a dict, and Prefect keeps an entry for the tuple and for each item in it. After
    the pruning no entry is left for the dicts and tuples (tracked by id alone) or for a dataclass that is gone,
    and the one still held (the last) keeps its link to the subflow's state."""
    from prefect import flow, task
    from prefect.context import FlowRunContext
    from prefect.utilities.engine import get_state_for_result

    @task
    def make_held(value: int) -> Held:
        return Held(value)

    @flow
    def child(value: int) -> tuple[Held, dict]:
        return make_held(value), {"rows": [value]}

    @flow
    def parent() -> tuple[int, int, list[bool], bool]:
        results = FlowRunContext.get().run_results
        gone = []
        for value in range(4):
            held, _ = child(value)
            gone.append((weakref.ref(held), id(held)))
        gc.collect()
        before = len(results)
        forget_dead_results()
        left_alive = [entry[2] is not None and entry[2]() is not None for entry in results.values()]
        dead_ids_left = any(ref() is None and key in results for ref, key in gone)
        return before, len(results), left_alive, get_state_for_result(held) is not None and not dead_ids_left

    before, after, left_alive, linked = parent()
    assert before == 12  # per subflow: the tuple, the Held, the dict
    assert 1 <= after <= 2 and all(left_alive)  # the last Held; prefect 3.8.8 also holds its first task's result
    assert linked
    assert forget_dead_results() == 0  # outside a flow run: nothing to prune
