"""core/heap.py: freezing a serving process's long-lived objects out of the collector, and
thawing them when a dropped engine's cycles must go."""

from __future__ import annotations

import gc
import weakref

from blitzscale.core.heap import free_frozen, freeze_heap


class Engine:  # stands for a dropped engine: a reference cycle holding a big buffer
    def __init__(self) -> None:
        self.me = self
        self.buffer = bytearray(1 << 20)


def test_frozen_objects_are_skipped_by_collections_and_free_frozen_reaches_their_cycles() -> None:
    try:
        engine = Engine()
        gone = weakref.ref(engine)
        freeze_heap()
        assert gc.get_freeze_count() > 0
        del engine
        gc.collect()
        assert gone() is not None  # frozen: no collection looks at its cycle
        free_frozen()
        assert gone() is None  # thawed, collected
        assert gc.get_freeze_count() > 0  # the survivors frozen again
    finally:
        gc.unfreeze()


def test_free_frozen_in_a_process_that_froze_nothing_only_collects() -> None:
    assert gc.get_freeze_count() == 0
    engine = Engine()
    gone = weakref.ref(engine)
    del engine
    free_frozen()
    assert gone() is None and gc.get_freeze_count() == 0
