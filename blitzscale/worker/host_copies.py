"""A rank's host copies of the models it holds: the cluster's one host-memory copy of each.

Making one takes seconds on a GPU (an 8B model: 16 GB of page-locked memory registered and
copied, ~4 s on an H200's host), so it is made on a thread of its own while the engine
keeps stepping, registered and copied a chunk at a time (one registration of it all held
the driver, and the steps, for 4-8 s: transfer/pinned.py); the controller can then ask for
it right after a model's first load, long before a release needs it, instead of on a
swap's critical path. Only the worker's main thread calls these methods (but `held`); the
copying thread writes nothing but its own result, which the main thread collects
(`settle`, or `finish` where a command needs the copy or is about to free the weights it
reads).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

from blitzscale.messages import HostCopyResult
from blitzscale.model.weights import ModelWeights

Done = Callable[[HostCopyResult | None, str], None]  # (result, "") or (None, error)
# After each chunk registered: 16 MB chunks with 1 ms pauses delayed no step by more than
# 6 ms on an H200 and made the whole copy of 16 GB in 4.1 s (one registration: 8.0 s, every
# step waiting for it; back to back, steps were starved: docs/results/host_copy_stall_h200.py)
_PAUSE_S = 0.001


class HostCopies:
    def __init__(self, device: torch.device) -> None:
        if device.type == "cuda" and device.index is None:  # (the thread needs the index)
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self._held: dict[str, ModelWeights] = {}
        self._making: dict[str, threading.Thread] = {}
        self._made: dict[str, ModelWeights | None] = {}  # the threads' results (None: failed)

    def __contains__(self, model: str) -> bool:
        return model in self._held or model in self._making

    def start(self, model: str, weights: ModelWeights, done: Done) -> None:
        """Copy `weights` (fully landed, read-only while served) to host memory on a thread;
        `done` is called from that thread once the copy is collectable."""
        if model in self:
            raise ValueError(f"already has a host copy of {model}")
        if not weights.readiness.all_ready:
            raise ValueError(f"holds only part of {model}: no host copy of it")
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        if stream is not None:  # (after whatever wrote the weights on this thread's stream)
            stream.wait_stream(torch.cuda.current_stream(self.device))

        def run() -> None:
            t = time.perf_counter()
            try:
                if stream is not None:  # (a thread starts on device 0: registering the host
                    torch.cuda.set_device(self.device)  # memory there would open a context on it)
                host = _copy(weights, stream)
            except Exception as e:  # answered, never a dead thread
                self._made[model] = None
                done(None, f"{type(e).__name__}: {e}")
                return
            self._made[model] = host
            seconds = time.perf_counter() - t
            done(HostCopyResult(bytes=host.layout.nbytes, pinned=stream is not None, seconds=seconds), "")

        thread = threading.Thread(target=run, name=f"host-copy-{model}", daemon=True)
        self._making[model] = thread
        thread.start()

    def finish(self, model: str) -> ModelWeights | None:
        """`model`'s host copy, waiting for it if it is still being made (None: none)."""
        thread = self._making.pop(model, None)
        if thread is not None:
            thread.join()
            self._collect(model)
        return self._held.get(model)

    def held(self, model: str) -> ModelWeights | None:
        """`model`'s finished host copy (None: none, or still being made); any thread."""
        return self._held.get(model)

    def settle(self) -> None:
        """Collect the copies whose threads have ended."""
        for model, thread in list(self._making.items()):
            if not thread.is_alive():
                del self._making[model]
                self._collect(model)

    def drop(self, model: str) -> None:
        self.finish(model)
        self._held.pop(model, None)

    def _collect(self, model: str) -> None:
        host = self._made.pop(model, None)
        if host is not None:
            self._held[model] = host


def _copy(weights: ModelWeights, stream: torch.cuda.Stream | None) -> ModelWeights:
    layout = weights.layout
    if stream is None:
        host = ModelWeights.empty(weights.config, weights.dtype, "cpu", layout.tp_size, layout.tp_rank)
        host.buffer.copy_(weights.buffer)
    else:
        from blitzscale.transfer.pinned import pinned_empty

        source = weights.buffer.view(torch.uint8)  # (registration chunks are byte ranges)

        def part(chunk: torch.Tensor, lo: int, hi: int) -> None:  # each chunk once registered
            with torch.cuda.stream(stream):
                chunk.copy_(source[lo:hi], non_blocking=True)
            time.sleep(_PAUSE_S)  # (the serving thread's driver calls go first)

        host = ModelWeights(weights.config, layout, pinned_empty(layout.numel, weights.dtype, on_chunk=part))
        stream.synchronize()
    host.readiness.mark_all_ready()
    return host
