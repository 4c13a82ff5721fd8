"""GPU tests share one pytest process: before and after each, what earlier tests left in the
caching allocator (a module's fixtures are dropped only after its last test) goes back to
the device, so a test that starts worker processes (which size their KV caches from the
free memory) finds the GPU as a fresh process would."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _give_device_memory_back(request: pytest.FixtureRequest) -> Iterator[None]:
    _empty()
    yield
    _empty()
    if torch.cuda.is_available() and (held := torch.cuda.memory_allocated()) > 1 << 30:
        warnings.warn(f"{request.node.nodeid} left {held / 2**30:.1f} GiB of live tensors", stacklevel=1)


def _empty() -> None:
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()
