"""Paged KV cache: the block pool (who owns which block; plain, the simulator's engine keeps
one) and the cache tensors (`KVCache`, torch: loaded on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from blitzscale.kvcache.pool import BlockPool
from blitzscale.lazy import exports

if TYPE_CHECKING:
    from blitzscale.kvcache.cache import KVCache

__getattr__ = exports(__name__, {"KVCache": "blitzscale.kvcache.cache"})
__all__ = ["BlockPool", "KVCache"]
