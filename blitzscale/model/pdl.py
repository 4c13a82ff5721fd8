"""Programmatic dependent launch on Hopper (imported on CUDA only).

A kernel launched with `launch_pdl=True` may start while the kernel before it in the
stream is still running: its programs do what needs nothing from that kernel (an FP8 GEMV
reads its first weight strip, model/fp8_matmul.py), then `wait_for_previous`, which returns
once the previous kernel has finished and its writes are visible. The previous kernel lets
it start early with `let_dependents_launch` (else it starts as the previous one ends, its
launch and first loads still hidden). Both are no-ops before sm_90 and on kernels launched
without the flag, so the kernels that call them run anywhere. Every program of a kernel
launched with the flag must wait before it reads another kernel's output or writes
anything: a kernel after it (launched normally) waits for it to end, so the chain stays
ordered.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl  # noqa: F401 (Triton's interpreter looks for it here)
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.language.target_info import cuda_capability_geq


@triton.jit
def let_dependents_launch():
    """The next kernel, if launched with `launch_pdl`, may start now (once every program
    of this one has called this or ended)."""
    if cuda_capability_geq(9, 0):
        gdc_launch_dependents()


@triton.jit
def wait_for_previous():
    """Blocks until the kernel before this one (launched with `launch_pdl`) has finished
    and its writes are visible."""
    if cuda_capability_geq(9, 0):
        gdc_wait()


def supported(device: torch.device) -> bool:
    """Whether kernels on `device` may be launched with `launch_pdl` (sm_90 and later)."""
    return device.type == "cuda" and _sm90(
        device.index if device.index is not None else torch.cuda.current_device()
    )


@functools.cache
def _sm90(index: int) -> bool:  # (asked at every GEMV launch: once per GPU)
    return torch.cuda.get_device_capability(index) >= (9, 0)
