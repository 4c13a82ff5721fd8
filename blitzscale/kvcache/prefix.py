"""Prefix hashes of full KV blocks: block i's hash covers its own tokens and, through the
hash of block i - 1, every token before it, so equal hashes mean equal prefixes.

128-bit BLAKE2b over the previous hash and the block's token ids (8 bytes each): a
collision, which would hand a request another prompt's keys and values, is as unlikely as
guessing a 128-bit key. One engine serves one model, so hashes need no model salt there;
instances of the same model agree on them (what prefix-aware routing can compare).
"""

from __future__ import annotations

import hashlib
from array import array

ROOT = b""  # the hash before a sequence's first block


def block_hash(prev: bytes, tokens: list[int]) -> bytes:
    h = hashlib.blake2b(prev, digest_size=16)
    h.update(array("q", tokens).tobytes())
    return h.digest()


def extend_hashes(hashes: list[bytes], token_ids: list[int], num_blocks: int, block_size: int) -> list[bytes]:
    """`hashes` (a sequence's, kept between calls: the tokens before a full block never
    change) extended to its first `num_blocks` full blocks; returns those."""
    while len(hashes) < num_blocks:
        i = len(hashes)
        block = token_ids[i * block_size : (i + 1) * block_size]
        hashes.append(block_hash(hashes[-1] if hashes else ROOT, block))
    return hashes[:num_blocks]
