"""What hashing a prompt's full KV blocks costs (`kvcache.prefix.extend_hashes`, run by the
engine's scheduler for every prompt when prefix caching is on, and by the router for
prefix-aware routing), against chaining `block_hash` block by block (an array of the
block's ids made for each, the form before), on one core; the hashes are the same.

Run (repo root): `.venv/bin/python docs/results/prefix_hash_cost.py`. Prints JSON.
"""

from __future__ import annotations

import json
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def best(fn: Callable[[], object], reps: int) -> float:
    """Seconds a call, the best of five timings of `reps` calls."""
    return min(timeit.repeat(fn, number=reps, repeat=5)) / reps


def main() -> None:
    from blitzscale.kvcache.prefix import ROOT, block_hash, extend_hashes

    def chained(tokens: list[int], blocks: int, size: int) -> list[bytes]:
        out: list[bytes] = []
        for i in range(blocks):
            out.append(block_hash(out[-1] if out else ROOT, tokens[i * size : (i + 1) * size]))
        return out

    rows = []
    for n_tokens in (512, 8192):
        toks = [(i * 7919) % 50_000 for i in range(n_tokens)]
        blocks = n_tokens // 16
        assert extend_hashes([], toks, blocks, 16) == chained(toks, blocks, 16)
        reps = max(20, 20_000 // blocks)
        before = best(lambda toks=toks, blocks=blocks: chained(toks, blocks, 16), reps)
        now = best(lambda toks=toks, blocks=blocks: extend_hashes([], toks, blocks, 16), reps)
        rows.append({"prompt_tokens": n_tokens, "block_size": 16, "before_ms": round(before * 1e3, 3),
                     "now_ms": round(now * 1e3, 3), "same_hashes": True})  # fmt: skip
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
