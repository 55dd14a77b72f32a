"""driver/garbage.py: each iteration's reference cycles are freed by the collection after it, while what was alive
before the first iteration is left to reference counting, and the process is as it was after the run."""
from __future__ import annotations

import gc
import weakref

from tailflow.driver.garbage import collect_iteration_garbage, iteration_garbage_collected


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_an_iterations_cycles_are_collected_and_what_was_loaded_before_is_left_alone():
    loaded = Node()
    loaded_ref = weakref.ref(loaded)
    with iteration_garbage_collected():
        assert gc.get_freeze_count() > 0
        made = Node()
        made_ref = weakref.ref(made)
        del made, loaded
        assert collect_iteration_garbage() >= 1
        assert made_ref() is None  # made during the run: freed by the collection after the iteration
        assert loaded_ref() is not None  # frozen: its cycle is not looked for while the run lasts
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert loaded_ref() is None  # given back to the collector after the run


def test_objects_someone_else_froze_stay_frozen():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with iteration_garbage_collected():
            pass
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
