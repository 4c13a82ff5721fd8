"""Paged KV cache: the block pool (who owns which block) and the cache tensors."""

from blitzscale.kvcache.cache import KVCache
from blitzscale.kvcache.pool import BlockPool

__all__ = ["BlockPool", "KVCache"]
