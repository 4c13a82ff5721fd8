"""Every simulated request's token times (its client's TBTs) and where its time to first
token went (`TtftParts`), kept by the simulated engines on the cluster's one recorder (a
request's tokens may come from two instances)."""

from __future__ import annotations

from dataclasses import dataclass

from blitzscale.client.record import TtftParts


@dataclass
class _FirstToken:
    """A request's marks on its way to its first token (base request id)."""

    reached: float  # when an instance first took it
    up_at: float  # when that instance began to serve (a live target: as its weights began to land)
    started: float | None = None  # the first step that computed some of its prompt
    load_wait_s: float = 0.0
    load_before_start_s: float = 0.0  # of that, before `started` (not the instance's queue)
    relay_from: float | None = None
    relay_s: float = 0.0


class Recorder:
    """Every request's token times (the client's TBTs), by request id, and the marks its
    `TtftParts` come from."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._tbts: dict[str, list[tuple[float, int]]] = {}  # (gap, count) runs
        self._first: dict[str, _FirstToken] = {}
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
        self._first.pop(rid, None)

    # --- the way to the first token (engines call these with base ids) --------------------

    def reached(self, rid: str, at: float, up_at: float) -> None:
        """An instance serving since `up_at` took the request (the first one counts)."""
        if rid not in self._first:
            self._first[rid] = _FirstToken(at, up_at)

    def started(self, rid: str, at: float) -> None:
        """A step starting `at` computes some of its prompt."""
        m = self._first.get(rid)
        if m is not None and m.started is None:
            m.started = at

    def waited_for_layers(self, rid: str, seconds: float) -> None:
        m = self._first.get(rid)
        if m is not None:
            m.load_wait_s += seconds
            if m.started is None:
                m.load_before_start_s += seconds

    def relay_began(self, rid: str, at: float) -> None:
        m = self._first.get(rid)
        if m is not None:
            m.relay_from = at

    def relay_ended(self, rid: str, at: float) -> None:
        m = self._first.get(rid)
        if m is not None and m.relay_from is not None:
            m.relay_s += at - m.relay_from
            m.relay_from = None

    def ttft_parts(self, rid: str, sent: float, ttft_s: float) -> TtftParts | None:
        """`rid`'s parts, its first token having come `ttft_s` after it was `sent`."""
        m = self._first.get(rid)
        if m is None:
            return None
        before = max(0.0, m.reached - sent)
        loading = max(0.0, min(m.reached, m.up_at) - sent)  # (its instance came up meanwhile)
        load = loading + m.load_wait_s
        first_step = m.started if m.started is not None else sent + ttft_s
        engine = max(0.0, first_step - m.reached - m.load_before_start_s)
        rest = ttft_s - before - engine - m.load_wait_s - m.relay_s
        return TtftParts(before - loading, engine, load, m.relay_s, max(0.0, rest))


def base_id(wire_id: str) -> str:
    """The router's request id of a worker-side id (a rerun adds '#n')."""
    base, sep, tail = wire_id.rpartition("#")
    return base if sep and tail.isdigit() else wire_id
