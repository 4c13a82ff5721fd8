"""A worker's device memory, accounted: what holds it, and whether something new fits
before it is allocated.

What holds it is read from what the worker owns when asked (each model's weights, held or
arriving; each serving engine's KV cache; the last deactivated engine; the standby's
buffer and engine): the worker's objects are the one record, nothing here can drift from
them. A load, a weight receive, an engine or the standby that does not fit is refused
before it allocates (`NoRoomError`: the reply says `no_room`, and the scaler waits and
tries again, control/backoff.py), with what it needs, what is free and what holds the rest;
a refusal never leaves half an allocation behind, as an out-of-memory error inside a load
could. The standby, which only waits for a model of its shape, is given up first when that
makes the room.

The capacity is the device's memory, or `[cluster] worker_memory_bytes` when that is lower
(a CPU worker is bounded by that cap alone). On a GPU what is in use is measured (torch's
live allocations and everything outside torch: the CUDA context, NCCL's buffers), so
graphs, workspaces and other processes on the device count too; what the holdings do not
explain is shown as "other".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from blitzscale.core.config import EngineConfig
from blitzscale.engine.engine import planned_kv_blocks
from blitzscale.errors import BlitzScaleError
from blitzscale.kvcache.cache import KVCache
from blitzscale.model.config import ModelConfig

GB = 1e9


class NoRoomError(BlitzScaleError):
    """Something does not fit the worker's device memory (nothing was allocated)."""


@dataclass(frozen=True)
class Holding:
    what: str  # "weights of m0", "engine of m0 (slot 1)", "standby buffer", ...
    nbytes: int


@dataclass(frozen=True)
class DeviceMemory:
    """One look at a worker's device memory."""

    capacity: int  # bytes the worker may hold there (0: no bound)
    used: int  # bytes in use now (a GPU: measured; a CPU: the holdings)
    holdings: tuple[Holding, ...]

    @property
    def free(self) -> int | None:
        """Bytes still free (None: no bound)."""
        return max(0, self.capacity - self.used) if self.capacity else None

    def fits(self, need: int, reclaimable: int = 0) -> bool:
        """Whether `need` bytes fit, once `reclaimable` bytes held now are given up."""
        free = self.free
        return free is None or need <= free + reclaimable

    def check(self, need: int, what: str, reclaimable: int = 0) -> None:
        """Raise NoRoomError naming the sizes unless `need` bytes for `what` fit."""
        if not self.fits(need, reclaimable):
            raise NoRoomError(f"no room on the device for {what}: {self.describe(need, reclaimable)}")

    def describe(self, need: int, reclaimable: int = 0) -> str:
        held = sum(h.nbytes for h in self.holdings)
        parts = [f"{h.what} {h.nbytes / GB:.2f} GB" for h in self.holdings]
        if self.used > held:
            parts.append(f"other {(self.used - held) / GB:.2f} GB")
        free = self.free or 0
        text = f"needs {need / GB:.2f} GB, {free / GB:.2f} GB of {self.capacity / GB:.2f} GB free"
        if reclaimable:
            text += f" (+{reclaimable / GB:.2f} GB of standby it may give up)"
        return f"{text}; held: {', '.join(parts) or 'nothing'}"


def measure(device: torch.device, holdings: Sequence[Holding], cap: int = 0) -> DeviceMemory:
    """`device`'s memory now, with what the worker says holds it. `cap`: a bound below the
    device's own memory (0: none)."""
    held = sum(h.nbytes for h in holdings)
    if device.type != "cuda":
        return DeviceMemory(capacity=cap, used=held, holdings=tuple(holdings))
    free, total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)  # reusable
    used = max(held, total - free - cached)
    return DeviceMemory(capacity=min(cap, total) if cap else total, used=used, holdings=tuple(holdings))


class DeviceRoom:
    """A worker's accounting of its device, over what the worker says it holds: whether
    something fits, and room made for it. `holdings()`: what holds the device now;
    `spares()`: the bytes of what may be given up for room (the standby, a drained engine)
    and `give_up()` frees them. `cap`: `[cluster] worker_memory_bytes` (0: none)."""

    def __init__(
        self,
        device: torch.device,
        cap: int,
        holdings: Callable[[], list[Holding]],
        spares: Callable[[], int],
        give_up: Callable[[], None],
    ) -> None:
        self.device = device
        self.cap = cap
        self.holdings = holdings
        self.spares = spares
        self.give_up = give_up

    def now(self) -> DeviceMemory:
        return measure(self.device, self.holdings(), self.cap)

    def make(self, need: int, what: str) -> None:
        """Make `need` bytes free for `what`, giving up the spares if that is what it
        takes; NoRoomError (nothing given up) if even that would not do."""
        mem = self.now()
        if mem.fits(need):
            return
        mem.check(need, what, self.spares())
        self.give_up()

    def for_engine(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype,
        weight_bytes: int,
        engine: EngineConfig,
        what: str,
        extra: int = 0,
    ) -> int | None:
        """Room for an engine's KV cache (and `extra` bytes besides, allocated with it):
        None when it fits as the engine plans it (the spares given up if that is what it
        takes); under a cap, else, the room there is once they are given up, if a request
        of the engine's whole context fits it; NoRoomError otherwise."""
        e = engine.for_device(self.device.type)
        per_block = KVCache.bytes_per_block(cfg, e.block_size, dtype)
        planned = max(0, planned_kv_blocks(cfg, dtype, self.device, weight_bytes, e)) * per_block + extra
        mem = self.now()
        if mem.fits(planned):
            return None
        if mem.fits(planned, self.spares()) or not self.cap:
            self.make(planned, what)
            return None
        context = min(e.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
        minimum = -(-context // e.block_size) * per_block + extra
        self.make(minimum, f"{what} (one request of {context} tokens)")
        self.give_up()
        free = self.now().free
        return None if free is None else free - extra
