"""A position-sensitive checksum of a weight buffer, computed where the buffer lives.

Fletcher-style: the sum of 64-bit words and the sum of words times (index mod 65521 + 1),
both wrapping. Computed in chunks on the buffer's own device, so checking a 16 GB copy on a
GPU takes milliseconds and proves the bytes identical to the source's (in practice).
"""

from __future__ import annotations

import torch

_CHUNK_WORDS = 1 << 25  # 256 MiB of int64 words
_MOD = 65521


def buffer_checksum(buf: torch.Tensor) -> str:
    raw = buf.detach().reshape(-1).view(torch.uint8)
    tail = raw.numel() % 8
    words = raw[: raw.numel() - tail].view(torch.int64)
    s1 = torch.zeros((), dtype=torch.int64, device=buf.device)
    s2 = torch.zeros((), dtype=torch.int64, device=buf.device)
    weights = (torch.arange(min(_CHUNK_WORDS, max(1, words.numel())), device=buf.device) % _MOD) + 1
    for start in range(0, words.numel(), _CHUNK_WORDS):
        chunk = words[start : start + _CHUNK_WORDS]
        s1 += chunk.sum()
        s2 += (chunk * weights[: chunk.numel()]).sum()
    if tail:
        s1 += raw[-tail:].to(torch.int64).sum()
    return f"{int(s1) & (2**64 - 1):016x}{int(s2) & (2**64 - 1):016x}"
