"""Scratch check (issue 27): two processes, one gloo group; rank 1 posts 10 receives, rank 0
sends three pieces and is SIGKILLed. Prints when each receive ended and how: with plain gloo
every pending receive fails within milliseconds of the kill ("Connection closed by peer").
Run: `.venv/bin/python docs/results/gloo_killed_peer.py`."""

import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank: int) -> None:
    store = dist.TCPStore("127.0.0.1", 29534, 2, rank == 0)
    pg = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=20))
    if rank == 1:
        works = [pg.recv([torch.zeros(1000)], 0, 0) for _ in range(10)]
        t0 = time.time()
        for i, w in enumerate(works):
            try:
                w.wait(timeout=timedelta(seconds=20))
                print(f"piece {i}: received at {time.time() - t0:.2f} s", flush=True)
            except RuntimeError as e:
                print(f"piece {i}: failed at {time.time() - t0:.2f} s: {str(e)[:80]}", flush=True)
    else:
        for _ in range(3):
            pg.send([torch.ones(1000)], 1, 0).wait()
            time.sleep(0.3)
        time.sleep(1)
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(0)


if __name__ == "__main__":
    procs = [mp.Process(target=run, args=(r,)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
