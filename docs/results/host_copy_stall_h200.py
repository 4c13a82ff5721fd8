"""Does making a host copy on a thread stall the thread that serves? (issue 29)

Session 20's swap run saw a model's first token 5.4 s after its 10.7 s disk load, and the
one thing started at its activation is its host copy (worker/host_copies.py: 16 GB of host
memory registered with CUDA, ~3.6 s, then copied). This measures it directly: one thread
runs decode-like steps (small matmuls, a synchronize each, as an engine step does) and
records each step's wall time; after 1 s another thread makes a host copy of a 16 GB device
buffer in one of these ways, each in a fresh process:

- `one`: the whole buffer registered with one `cudaHostRegister`, then copied (the code
  before this change);
- `chunked-MB-PAUSE`: registered and copied a chunk of MB at a time (transfer/pinned.py),
  the copying thread sleeping PAUSE ms after each (a waiting thread gets the driver);
- `prefault`: every page touched first (no driver call), then one registration;
- `python`: the same as `one`, but the stepping thread runs pure Python with no CUDA call
  (does the registration hold the GIL?).

Then the whole buffer is copied back to the device (one copy per registration: one copy may
not span two), at the pinned rate or not. Prints JSON: per way, the steps' median and max
wall time while the copy ran, the time the copy took, and the stall
(the sum of each step's excess over the median before the copy).

Run (GPU machine): `python3 docs/results/host_copy_stall_h200.py [--gb 16] [--out FILE]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def one_way(way: str, gb: float) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    from blitzscale.transfer import pinned
    from blitzscale.transfer.pinned import copy_pinned, pinned_empty

    dev = torch.device("cuda", 0)
    nbytes = int(gb * 1e9)
    weights = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    a = torch.randn(64, 4096, device=dev, dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize()

    def cuda_step() -> None:
        x = a
        for _ in range(32):
            x = x @ w
        torch.cuda.synchronize()

    def python_step() -> None:
        s = 0
        for i in range(20_000):
            s += i

    step = python_step if way == "python" else cuda_step
    for _ in range(20):
        step()
    copy_times: dict[str, float] = {}

    def copy() -> None:
        torch.cuda.set_device(dev)
        stream = torch.cuda.Stream(dev)
        t = time.perf_counter()

        def part(host: torch.Tensor, lo: int, hi: int) -> None:
            with torch.cuda.stream(stream):
                host.copy_(weights[lo:hi], non_blocking=True)

        if way.startswith("chunked"):  # chunked[-MB[-pause ms]]
            parts = way.split("-")
            mb = parts[1] if len(parts) > 1 else "256"
            pause_ms = parts[2] if len(parts) > 2 else "0"
            pinned.CHUNK_BYTES = int(mb) << 20

            def part_and_pause(host: torch.Tensor, lo: int, hi: int) -> None:
                part(host, lo, hi)
                time.sleep(float(pause_ms) / 1e3)

            held["host"] = pinned_empty(nbytes, torch.uint8, on_chunk=part_and_pause)
        else:  # one registration of it all (after touching every page, for `prefault`)
            raw = torch.empty(nbytes, dtype=torch.uint8)
            if way == "prefault":
                raw.zero_()
                copy_times["touched_s"] = time.perf_counter() - t
            err = torch.cuda.cudart().cudaHostRegister(raw.data_ptr(), nbytes, 0)
            assert int(err) == 0, err
            held["host"] = raw
            copy_times["registered_s"] = time.perf_counter() - t
            part(held["host"], 0, nbytes)
        stream.synchronize()
        copy_times["copy_s"] = time.perf_counter() - t
        copy_times["ended"] = time.perf_counter()

    held: dict[str, torch.Tensor] = {}
    steps: list[tuple[float, float]] = []
    start = time.perf_counter()
    thread = threading.Thread(target=copy)
    begun = None
    while True:
        now = time.perf_counter()
        if begun is None and now - start > 1.0:
            begun = now
            thread.start()
        if begun is not None and "ended" in copy_times and now - copy_times["ended"] > 0.5:
            break
        t = time.perf_counter()
        step()
        steps.append((t, time.perf_counter() - t))
    thread.join()
    assert begun is not None
    best = float("inf")  # the whole buffer back in one copy: at the pinned rate?
    for _ in range(3):
        t = time.perf_counter()
        copy_pinned(weights, held["host"], non_blocking=True)  # (one copy each registration)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    before = [d for t, d in steps if t < begun]
    during = [d for t, d in steps if begun <= t <= copy_times["ended"]]
    base = statistics.median(before)
    return {
        "way": way,
        "gb": gb,
        "step_median_before_ms": round(base * 1e3, 3),
        "step_median_during_ms": round(statistics.median(during) * 1e3, 3) if during else None,
        "step_max_during_ms": round(max(during) * 1e3, 1) if during else None,
        "steps_during": len(during),
        "stall_s": round(sum(max(0.0, d - base) for d in during), 3),
        "registered_s": round(copy_times.get("registered_s", 0.0), 3),
        "touched_s": round(copy_times.get("touched_s", 0.0), 3),
        "copy_s": round(copy_times["copy_s"], 3),
        "h2d_one_copy_s": round(best, 4),
        "h2d_GBps": round(nbytes / best / 1e9, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, default=16.06)
    p.add_argument("--ways", default="one,chunked,prefault,python")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--out")
    args = p.parse_args()
    if args.one:
        print(json.dumps(one_way(args.one, args.gb)))
        return
    results = []
    for way in args.ways.split(","):
        cmd = [sys.executable, __file__, "--one", way, "--gb", str(args.gb)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            results.append({"way": way, "error": done.stderr[-2000:]})
        else:
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), file=sys.stderr)
    text = json.dumps({"results": results}, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
