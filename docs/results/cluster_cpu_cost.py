"""What a serving cluster costs in CPU on this machine, started and at rest: the CPU
seconds the whole machine spent while `ServingCluster.start()` ran (workers forked, the
model loaded, engines built) and the share of a core it burns afterwards with no request
(the workers' loops and stats, the router's rounds), from /proc/stat. Run it with the
machine otherwise quiet: it measures the whole machine.

Run (repo root): `.venv/bin/python docs/results/cluster_cpu_cost.py`. Prints JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def busy_cpu_s() -> float:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    from blitzscale.serve.background import LoopThread
    from blitzscale.serve.config import ServeConfig
    from blitzscale.serve.server import ServingCluster

    out = []
    for mode, workers in (("colocated", 2), ("pd", 3)):
        cfg = ServeConfig().with_overrides(cluster={"num_workers": workers}, router={"mode": mode})
        lt, svc = LoopThread(), ServingCluster(cfg)
        t, c = time.monotonic(), busy_cpu_s()
        lt.run(svc.start())
        start_s, start_cpu = time.monotonic() - t, busy_cpu_s() - c
        time.sleep(3)
        t, c = time.monotonic(), busy_cpu_s()
        time.sleep(20)
        idle = (busy_cpu_s() - c) / (time.monotonic() - t)
        lt.run(svc.stop())
        lt.close()
        out.append(
            {
                "mode": mode,
                "workers": workers,
                "start_s": round(start_s, 2),
                "start_cpu_s": round(start_cpu, 2),
                "at_rest_share_of_a_core": round(idle, 3),
            }
        )
    t, c = time.monotonic(), busy_cpu_s()
    time.sleep(10)
    rest = (busy_cpu_s() - c) / (time.monotonic() - t)
    print(json.dumps({"clusters": out, "machine_at_rest": round(rest, 3)}))


if __name__ == "__main__":
    main()
