"""Process trees from Linux /proc, for tests that check what a command left running."""

from __future__ import annotations

from pathlib import Path


def parent_pids() -> dict[int, int]:
    """Every process's parent, by pid (processes that end while read are skipped)."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return parents


def descendants(pid: int) -> set[int]:
    """Children, grandchildren and so on of `pid`, now."""
    parents = parent_pids()
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier} - found
        found |= frontier
    return found
