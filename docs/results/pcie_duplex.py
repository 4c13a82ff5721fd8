"""Is a GPU's PCIe link full duplex? Pinned host -> GPU alone, GPU -> host alone, and both
at once on two streams (the simulator's `pcie-in` / `pcie-out` links assume each direction
keeps its full rate while the other runs: sim/links.py). Prints JSON; run on a GPU machine:

    python3 docs/results/pcie_duplex.py > docs/results/pcie_duplex_<gpu>.json
"""

from __future__ import annotations

import json

import torch

GIB = 1 << 30


def main(nbytes: int = 2 * GIB, reps: int = 5) -> dict[str, object]:
    dev = torch.device("cuda")
    h_in = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    h_out = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    d_in = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    d_out = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    s_in, s_out = torch.cuda.Stream(), torch.cuda.Stream()

    def timed(up: bool, down: bool) -> float:
        """The best of `reps`: seconds for the copies asked for, started together."""
        best = float("inf")
        for _ in range(reps):
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for stream, on, (dst, src) in ((s_in, up, (d_in, h_in)), (s_out, down, (h_out, d_out))):
                if on:
                    stream.wait_event(start)
                    with torch.cuda.stream(stream):
                        dst.copy_(src, non_blocking=True)
            for stream in (s_in, s_out):
                torch.cuda.current_stream().wait_stream(stream)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1000)
        return best

    up, down, both = timed(True, False), timed(False, True), timed(True, True)
    gbps = nbytes / 1e9
    return {
        "device": torch.cuda.get_device_name(dev),
        "bytes": nbytes,
        "host_to_gpu_GBps": round(gbps / up, 2),
        "gpu_to_host_GBps": round(gbps / down, 2),
        # both directions at once: each direction's rate (a full-duplex link keeps both)
        "both_each_GBps": round(gbps / both, 2),
        "both_over_slower_alone": round(max(up, down) / both, 3),
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
