"""Keeping Python's cyclic garbage collector off a serving process's long-lived objects.

A worker holds some 180k Python objects once its engine is built (modules, the model's
and the cache's bookkeeping); every full collection walks them all. Step traces of an
H200 worker under `bench serve` (docs/benchmarks.md) showed four full collections of about
110 ms each, every one a stall of the serving loop, and each costs more than the work it
finds. `gc.freeze()` moves every object alive now to a generation the collector never
scans; what is allocated afterwards (requests, outputs) is collected as before. A
dropped engine or model can sit in reference cycles among those frozen objects, so freeing
one (`free_frozen`) thaws everything first, collects, and freezes the survivors again.
"""

from __future__ import annotations

import gc


def freeze_heap(collect: bool = True) -> None:
    """Exempt everything alive now from future collections; `collect` first frees what is
    garbage already (a full collection: call it before serving, not while), else that
    garbage stays for the life of the process."""
    if collect:
        gc.collect()
    gc.freeze()


def free_frozen() -> None:
    """A full collection that reaches frozen objects too (an engine or weights just dropped,
    whose cycles hold device memory), then the survivors frozen again (a process that
    never froze anything, a test's, is only collected)."""
    if not gc.get_freeze_count():
        gc.collect()
        return
    gc.unfreeze()
    freeze_heap()
