"""Host copies in page-locked memory of exactly their size (transfer/pinned.py): CUDA sees
the memory as pinned, bytes go to the device and back unchanged, and the registration goes
with the last tensor over it. Run on a GPU machine with `make test-gpu`."""

from __future__ import annotations

import gc
import itertools

import pytest
import torch

from blitzscale.model.weights import ModelWeights
from blitzscale.transfer.pinned import CHUNK_BYTES, copy_pinned, pinned_empty

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_exactly_sized_pinned_memory_round_trips_and_unregisters() -> None:
    n = (3 << 20) + 5  # (not a power of two)
    host = pinned_empty(n, torch.bfloat16)
    assert host.is_pinned() and host.numel() == n and host.dtype == torch.bfloat16
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    # (through copy_pinned: 6 MB may straddle a CHUNK_BYTES edge, two registrations, which
    # one CUDA copy may not span; alone, the allocation happened not to straddle one)
    copy_pinned(host, src, non_blocking=True)
    torch.cuda.synchronize()
    back = torch.empty_like(src)
    copy_pinned(back, host, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(back, src)
    view = host[10:20]
    del host
    gc.collect()
    assert view.is_pinned()  # (a view keeps the registration)
    del view
    gc.collect()  # (unregistered now; a later registration of the same pages would fail if not)
    again = pinned_empty(n, torch.bfloat16)
    assert again.is_pinned()


def test_memory_registered_a_chunk_at_a_time_is_filled_as_it_goes_and_copies_back() -> None:
    """Registered in chunks (one driver call never holds the device long): `on_chunk` sees
    each chunk once, in order, covering every byte; `copy_pinned` copies across the chunks'
    edges both ways (one CUDA copy may not span two registrations); every chunk is
    unregistered with the last tensor over it."""
    n = 2 * CHUNK_BYTES + (CHUNK_BYTES // 2) + 3  # bytes: three or four chunks
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    seen: list[tuple[int, int]] = []

    def part(host: torch.Tensor, lo: int, hi: int) -> None:
        assert host.is_pinned() and host.numel() == hi - lo
        host.copy_(src[lo:hi])
        seen.append((lo, hi))

    host = pinned_empty(n, torch.uint8, on_chunk=part)
    assert seen[0][0] == 0 and seen[-1][1] == n and len(seen) in (3, 4)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(seen))
    assert all(0 < hi - lo <= CHUNK_BYTES for lo, hi in seen)
    assert torch.equal(host, src.cpu())
    back = torch.empty_like(src)
    copy_pinned(back, host, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(back, src)
    half = torch.zeros(n // 2, dtype=torch.uint8, device="cuda")  # a piece across an edge
    copy_pinned(half, host[n // 4 : n // 4 + n // 2])
    assert torch.equal(half, src[n // 4 : n // 4 + n // 2])
    host2 = pinned_empty(n // 2, torch.uint8)
    copy_pinned(host2, half)
    assert torch.equal(host2, half.cpu())
    del host, host2
    gc.collect()
    again = pinned_empty(n, torch.uint8)  # (the same pages, if reused: all unregistered)
    assert again.is_pinned()


def test_a_host_copy_of_weights_is_pinned_at_its_size() -> None:
    from blitzscale.checkpoint import load_config, resolve_model

    cfg = load_config(resolve_model("random:tiny-llama3"))
    w = ModelWeights.empty(cfg, torch.bfloat16, "cpu", pin_memory=True)
    assert w.buffer.is_pinned() and w.buffer.device.type == "cpu"
    assert w.buffer.numel() == w.layout.numel


def test_a_host_copy_made_on_its_thread_while_the_device_computes_is_exact() -> None:
    """worker/host_copies.py on CUDA: the copy runs on a stream of its own, on a thread,
    while the main thread keeps queueing work on the device; it waits for what wrote the
    weights, lands pinned, and equals them."""
    import threading

    from blitzscale.checkpoint import load_config, resolve_model
    from blitzscale.worker.host_copies import HostCopies

    cfg = load_config(resolve_model("random:tiny-llama3"))
    w = ModelWeights.empty(cfg, torch.bfloat16, "cuda")
    w.buffer.normal_()  # (queued on the current stream: the copy must come after it)
    w.readiness.mark_all_ready()
    copies = HostCopies(torch.device("cuda"))
    answered = threading.Event()
    got = []

    def done(result, err):  # type: ignore[no-untyped-def]
        got.append((result, err))
        answered.set()

    copies.start("m", w, done)
    a = torch.randn(2048, 2048, device="cuda")
    for _ in range(20):  # the device stays busy meanwhile
        a = a @ a / 2048
    assert answered.wait(120)
    ((result, err),) = got
    assert err == "" and result.pinned and result.bytes == w.layout.nbytes and result.seconds > 0
    host = copies.finish("m")
    assert host is not None and host.buffer.is_pinned()
    assert torch.equal(host.buffer, w.buffer.cpu())
