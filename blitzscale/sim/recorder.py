"""Every simulated request's token times (its client's TBTs), kept by the simulated engines
on the cluster's one recorder (a request's tokens may come from two instances)."""

from __future__ import annotations


class Recorder:
    """Every request's token times (the client's TBTs), by request id."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._tbts: dict[str, list[tuple[float, int]]] = {}  # (gap, count) runs
        self.prefix_queries = 0  # prompt tokens looked up in the engines' prefix caches
        self.prefix_hits = 0  # of those, found there (not computed)

    def prefix(self, queried: int, hit: int) -> None:
        self.prefix_queries += queried
        self.prefix_hits += hit

    def first(self, rid: str, at: float) -> None:
        self._last[rid] = at
        self._tbts.setdefault(rid, [])

    def steps(self, rid: str, start: float, step_s: float, n: int) -> None:
        """`n` tokens from decode steps of `step_s` starting at `start`."""
        if n <= 0 or rid not in self._last:
            return
        runs = self._tbts[rid]
        runs.append((start + step_s - self._last[rid], 1))
        if n > 1:
            runs.append((step_s, n - 1))
        self._last[rid] = start + n * step_s

    def tbts(self, rid: str) -> tuple[float, ...]:
        return tuple(gap for gap, n in self._tbts.get(rid, ()) for _ in range(n))

    def forget(self, rid: str) -> None:
        self._last.pop(rid, None)
        self._tbts.pop(rid, None)


def base_id(wire_id: str) -> str:
    """The router's request id of a worker-side id (a rerun adds '#n')."""
    base, sep, tail = wire_id.rpartition("#")
    return base if sep and tail.isdigit() else wire_id
