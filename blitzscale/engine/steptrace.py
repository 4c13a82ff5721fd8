"""A line of JSON per engine step, for finding where a serving loop's time goes.

`BLITZSCALE_STEP_TRACE=PREFIX` makes every process that steps an engine (a worker, `bench
serve`'s engine-alone half) append to `PREFIX.<pid>.jsonl`: the step's kind, its prompt
tokens and chunks (and how many of them continue a cached prefix), its decode rows, the
wall time the caller measured around it, the host time up to the forward's launch and to
its return, and, where the step's device work had finished by the time it is written, the
forward's device time between two CUDA events; on CUDA also the Triton kernels compiled
during the step (name and ms) and the caching allocator's new segments and retries (a
retry frees every cached block: a device-wide synchronization). Off by default (the
events cost a little); a diagnostic, not a metric: /metrics has the per-kind totals.
The file's first line (`"process": true`) says how the process runs: its torch threads,
its Python threads, and on CUDA the module-loading mode the driver really uses.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import torch

from blitzscale.engine.work import StepWork

TRACE_PREFIX = os.environ.get("BLITZSCALE_STEP_TRACE", "")
ALLOC_COUNTERS = ("num_alloc_retries", "num_device_alloc", "num_device_free")


class _Compiles:
    """Triton's JIT hooks: each kernel compiled in this process, with its milliseconds."""

    def __init__(self) -> None:
        self.done: list[tuple[str, float]] = []
        self._started = 0.0

    def install(self) -> None:
        from triton import knobs

        knobs.runtime.jit_cache_hook = self._before
        knobs.runtime.jit_post_compile_hook = self._after

    def _before(self, **kw: Any) -> bool:
        self._started = time.perf_counter()
        return False  # (True would skip the compile)

    def _after(self, **kw: Any) -> bool:
        self.done.append((kw["fn"].name, round(1000 * (time.perf_counter() - self._started), 1)))
        return False

    def take(self) -> list[tuple[str, float]]:
        out, self.done = self.done, []
        return out


_COMPILES = _Compiles()


class _Collections:
    """Python's garbage collections (generation, ms) since the last `take`."""

    def __init__(self) -> None:
        self.done: list[tuple[int, float]] = []
        self._started = 0.0
        self._on = False

    def install(self) -> None:
        if not self._on:
            gc.callbacks.append(self._hook)
            self._on = True

    def _hook(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.done.append((info["generation"], round(1000 * (time.perf_counter() - self._started), 1)))

    def take(self) -> list[tuple[int, float]]:
        out, self.done = self.done, []
        return out


_COLLECTIONS = _Collections()


def driver_module_loading() -> str | None:
    """The CUDA driver's module-loading mode in this process ("eager" or "lazy"), or None
    where it cannot be asked (no driver, an old one). `CUDA_MODULE_LOADING` is read when
    the driver initialises: setting it later changes nothing, and only the driver knows."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        mode = ctypes.c_int(0)
        if lib.cuModuleGetLoadingMode(ctypes.byref(mode)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return {1: "eager", 2: "lazy"}.get(mode.value, str(mode.value))


def process_line(cuda: bool) -> dict[str, Any]:
    """The trace's first line: what of the process shapes its host time."""
    return {
        "process": True,
        "pid": os.getpid(),
        "torch_threads": torch.get_num_threads(),
        "python_threads": sorted(t.name for t in threading.enumerate()),
        "switch_interval_s": sys.getswitchinterval(),
        "env_module_loading": os.environ.get("CUDA_MODULE_LOADING"),
        "driver_module_loading": driver_module_loading() if cuda else None,
    }


class StepTrace:
    """Marks one step's phases (`begin`, `launched`, `returned`) and writes its line."""

    def __init__(self, prefix: str, device: torch.device) -> None:
        self.path = Path(f"{prefix}.{os.getpid()}.jsonl")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._out: IO[str] = self.path.open("a", buffering=1)
        self.cuda = device.type == "cuda"
        self._t0 = self._t_launch = self._t_return = 0.0
        self._events: tuple[Any, Any] | None = None
        self._alloc: dict[str, int] = {}
        _COLLECTIONS.install()
        if self.cuda:
            _COMPILES.install()
        self._out.write(json.dumps(process_line(self.cuda)) + "\n")

    def _alloc_counts(self) -> dict[str, int]:
        stats = torch.cuda.memory_stats()
        return {k: int(stats.get(k, 0)) for k in ALLOC_COUNTERS}

    def begin(self) -> None:
        _COLLECTIONS.take()
        if self.cuda:
            _COMPILES.take()
            self._alloc = self._alloc_counts()
        self._t0 = time.perf_counter()
        self._t_launch = self._t_return = self._t0
        self._events = None

    def launching(self) -> None:
        self._t_launch = time.perf_counter()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self._events = (start, end)

    def returned(self) -> None:
        self._t_return = time.perf_counter()
        if self._events is not None:
            self._events[1].record()

    def write(self, work: StepWork, wall_s: float) -> None:
        device_ms = None
        if self._events is not None and self._events[1].query():
            device_ms = round(self._events[0].elapsed_time(self._events[1]), 3)
        line: dict[str, Any] = {
            "t": round(self._t0, 6),
            "kind": work.kind,
            "prompt_tokens": work.prompt_tokens,
            "chunks": work.chunks,
            "prefixed_chunks": work.prefixed_chunks,
            "decode": work.decode_batch,
            "running": work.running,
            "waiting": work.waiting,
            "overlapped": work.overlapped,
            "oom": work.oom,
            "wall_ms": round(1000 * wall_s, 3),
            "to_launch_ms": round(1000 * (self._t_launch - self._t0), 3),
            "launch_ms": round(1000 * (self._t_return - self._t_launch), 3),
            "device_ms": device_ms,
        }
        line["gc"] = _COLLECTIONS.take()
        if self.cuda:
            after = self._alloc_counts()
            line["alloc"] = {k: after[k] - self._alloc.get(k, 0) for k in ALLOC_COUNTERS}
            line["compiled"] = _COMPILES.take()
        self._out.write(json.dumps(line) + "\n")


def step_trace(device: torch.device) -> StepTrace | None:
    """The trace for an engine on `device`, or None when BLITZSCALE_STEP_TRACE is unset."""
    return StepTrace(TRACE_PREFIX, device) if TRACE_PREFIX else None
