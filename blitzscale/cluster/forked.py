"""A local worker process's first code (`ProcessSpawner`, forked from multiprocessing's
forkserver): it imports nothing of ours, so the modules that read settings from the
environment when imported read the controller's, not the forkserver's."""

from __future__ import annotations

import os
import pickle


def forked_main(env: dict[str, str], cfg: bytes) -> None:
    """The controller's environment as it was at the spawn (the forkserver's is as it was
    when the server started), then the worker: `cfg`, a pickled `WorkerConfig`, is only
    unpickled now, as that imports our modules."""
    os.environ.clear()
    os.environ.update(env)
    from blitzscale.worker.worker import process_main

    process_main(pickle.loads(cfg))
