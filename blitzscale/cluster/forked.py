"""A local worker process's first code (`ProcessSpawner`, forked from multiprocessing's
forkserver): it imports nothing of ours, so the modules that read settings from the
environment when imported read the controller's, not the forkserver's."""

from __future__ import annotations

import os
import pickle
import signal


def forked_main(env: dict[str, str], cfg: bytes) -> None:
    """The controller's environment as it was at the spawn (the forkserver's is as it was
    when the server started), then the worker: `cfg`, a pickled `WorkerConfig`, is only
    unpickled now, as that imports our modules."""
    # Ctrl-C reaches the whole process group, also while this worker still imports its
    # modules (seconds): the controller decides when workers stop (worker_main says so too).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.clear()
    os.environ.update(env)
    _let_the_forkserver_go()
    from blitzscale.worker.worker import process_main

    process_main(pickle.loads(cfg))


def _let_the_forkserver_go() -> None:
    """Close this process's copy of the forkserver's "alive" pipe. The server ends when
    that pipe's write end is closed everywhere, which should be when the controller ends;
    multiprocessing hands every child a copy too (so that it could use the same server),
    and with those open the server, and so the workers' parent, outlived a controller that
    was killed: a worker leaves when its parent changes, so none did."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
