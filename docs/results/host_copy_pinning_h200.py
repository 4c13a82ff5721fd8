"""Scratch measurement (issue 29): what making a model's host copy costs on the GPU's host,
pinned by torch's caching host allocator (`pin_memory=True`, rounded up to a power of two)
against exactly-sized memory registered with CUDA (transfer/pinned.py), for Llama-3-8B's
16.06 GB in bf16: allocation, the device-to-host copy, and the host-to-device copy back (a
swap's transfer), beside a plain pageable copy. Each way in a fresh process (torch's host
allocator caches what it pinned). Prints JSON.

Run (GPU machine, repo root): `python3 docs/results/host_copy_pinning_h200.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NBYTES = 16_060_522_496  # random Llama-3-8B in bf16 (bench engine's weight_bytes)


def one(way: str) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    from blitzscale.transfer.pinned import pinned_empty

    numel = NBYTES // 2
    dev = torch.empty(numel, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    if way == "torch_pin_memory":
        host = torch.empty(numel, dtype=torch.bfloat16, pin_memory=True)
    elif way == "registered":
        host = pinned_empty(numel, torch.bfloat16)
    else:
        host = torch.empty(numel, dtype=torch.bfloat16)
    alloc_s = time.perf_counter() - t
    out = {"way": way, "alloc_s": round(alloc_s, 3), "is_pinned": host.is_pinned()}
    for name, dst, src in (("d2h", host, dev), ("h2d", dev, host), ("d2h_again", host, dev)):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        s = time.perf_counter() - t
        out[f"{name}_s"] = round(s, 3)
        out[f"{name}_GBps"] = round(NBYTES / s / 1e9, 1)
    out["first_host_copy_s"] = round(alloc_s + out["d2h_s"], 3)
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(one(sys.argv[1])))
        sys.exit(0)
    results = []
    for way in ("torch_pin_memory", "registered", "pageable"):
        r = subprocess.run([sys.executable, __file__, way], capture_output=True, text=True, timeout=300)
        results.append(json.loads(r.stdout) if r.returncode == 0 else {"way": way, "error": r.stderr[-1500:]})
    print(json.dumps({"bytes": NBYTES, "results": results}, indent=1))
