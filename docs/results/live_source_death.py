"""Scratch measurement (issue 27): how long the requests of a burst take to end after the
weight source of a live target is killed mid-transfer (the scenario of
tests/serve/test_live.py's `[colocated-source]` death test: 3 CPU workers, SmolLM2, the
test's capped link), and how the target's transfer ended (its receive failing at once,
"Connection closed by peer", or gloo's 30 s receive timeout), and whether the router gave
the target up first on finding its weight source dead (`abandoned`: its waiting prompts
run again at once, whatever the receive does). Prints one JSON line per run.
Run: `.venv/bin/python docs/results/live_source_death.py [runs]` from the repo root."""

import asyncio
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


class Lost(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def one_run() -> dict:
    import torch

    from blitzscale.errors import BlitzScaleError
    from blitzscale.serve.background import LoopThread
    from blitzscale.serve.server import ServingCluster
    from tests.serve.test_live import Client, live_config, prompts

    torch.set_num_threads(1)
    lost = Lost()
    logging.getLogger("blitzscale").addHandler(lost)
    lt = LoopThread()
    service = ServingCluster(live_config("colocated", 3))
    lt.run(service.start())
    router, cluster = service.router, service.cluster
    ps = prompts(service, 10)
    client = Client(service)

    async def guarded(i: int) -> object:
        try:
            return await client.one(f"b{i}", ps[i])
        except BlitzScaleError as e:
            return str(e)

    async def scenario() -> float:
        tasks = [asyncio.create_task(guarded(i)) for i in range(len(ps))]
        while not any(i.live_ready for i in router.instances.values() if i.rank in router.live.pairs):
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # some layers in, some tasks queued at the target
        cluster.procs[0].kill()
        t0 = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*tasks), 150)
        return time.monotonic() - t0

    try:
        done_s = lt.run(scenario(), timeout=200)
        abandoned = router.live.abandoned_total
    finally:
        lt.run(service.stop())
        lt.close()
        logging.getLogger("blitzscale").removeHandler(lost)
    failed = [x for x in lost.lines if "loading the weights failed" in x]
    how = "timeout" if any("Timed out" in x for x in failed) else "closed" if failed else "none"
    return {"all_done_after_kill_s": round(done_s, 1), "target_receive_ended_by": how, "abandoned": abandoned}


def main() -> None:
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        print(json.dumps(one_run()), flush=True)


if __name__ == "__main__":
    main()
