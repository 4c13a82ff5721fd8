"""Scratch measurement (issue 27): the CPU each worker process spends to start, serve one
request and stop, in a 3-worker local cluster of SmolLM2 on CPU, with the forkserver
preloading torch only (`torch-only`) or also transformers' tokenizer classes (the
default). Prints one JSON line. Run: `.venv/bin/python docs/results/worker_start_cpu.py
[torch-only]` from the repo root, a few times each way, on a quiet machine."""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def cpu_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def main():
    import torch

    torch.set_num_threads(1)
    if len(sys.argv) > 1 and sys.argv[1] == "torch-only":
        import blitzscale.cluster.spawn as sp

        sp.FORKSERVER_PRELOAD[:] = ["torch"]
    from blitzscale.serve.background import LoopThread
    from blitzscale.serve.server import ServingCluster
    from tests.serve.test_live import live_config

    lt = LoopThread()
    svc = ServingCluster(live_config("colocated", 3))
    t = time.time()
    lt.run(svc.start())
    start = time.time() - t
    # one request so the first instance's tokenizer is surely loaded
    ids = svc.router.encode("hello there " * 5)
    from blitzscale.core.sampling import SamplingParams

    async def one():
        out = []
        async for o in svc.router.generate("r", ids, SamplingParams(max_tokens=2, temperature=0)):
            out += o.new_token_ids
        return out

    lt.run(one())
    cpus = [cpu_of(p.pid) for p in svc.cluster.procs]
    lt.run(svc.stop())
    lt.close()
    print(
        json.dumps(
            {
                "mode": sys.argv[1:] or ["preload"],
                "start_s": round(start, 2),
                "worker_cpu_s": [round(c, 2) for c in cpus],
            }
        )
    )


if __name__ == "__main__":
    main()
