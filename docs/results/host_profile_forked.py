"""Scratch: host_profile_llama3-8b_h200.py run in a child of a forkserver that preloaded
torch, as local workers start (cluster/spawn.py), to tell the process start apart from
the worker's settings."""

import multiprocessing as mp
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def child(env: dict[str, str]) -> None:
    os.environ.update(env)
    sys.argv = ["host_profile"]
    runpy.run_path(os.path.join(HERE, "host_profile_llama3-8b_h200.py"), run_name="__main__")


if __name__ == "__main__":
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch"])
    for env in ({}, {"THREADS": "1", "CUDA_MODULE_LOADING": "EAGER"}):
        print("== forked", env, flush=True)
        p = ctx.Process(target=child, args=(env,))
        p.start()
        p.join()
