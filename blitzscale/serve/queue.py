"""The router's global FCFS queue, bounded by the prompt tokens it holds and by how long
its head has waited: beyond either bound new work is refused (HTTP 429 with Retry-After)
rather than left to wait without end."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator

from blitzscale import clock
from blitzscale.serve.requests import RouterRequest


class RequestQueue:
    def __init__(self, max_tokens: int = 0, max_wait_s: float = 0.0) -> None:
        """`max_tokens` / `max_wait_s`: 0 means no bound."""
        self.max_tokens = max_tokens
        self.max_wait_s = max_wait_s
        self._q: deque[RouterRequest] = deque()
        self.num_tokens = 0  # prompt tokens of the queued requests
        self._tokens_of: Counter[str] = Counter()  # the same, by model

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[RouterRequest]:
        return iter(self._q)

    def __bool__(self) -> bool:
        return bool(self._q)

    def tokens_of(self, model: str) -> int:
        """Prompt tokens queued for `model`."""
        return self._tokens_of[model]

    @property
    def head(self) -> RouterRequest:
        return self._q[0]

    def can_take(self, num_tokens: int) -> bool:
        """Room for a new request of `num_tokens` prompt tokens (an empty queue always has:
        a request the engine can hold at all is never refused for its size alone)."""
        return not self._q or not self.max_tokens or self.num_tokens + num_tokens <= self.max_tokens

    def push(self, r: RouterRequest) -> None:
        r.queued_at = clock.now()
        self._q.append(r)
        self._count(r, 1)

    def push_front(self, r: RouterRequest) -> None:
        """Back to the head (a request its instance lost before any output); its wait
        starts again."""
        r.queued_at = clock.now()
        self._q.appendleft(r)
        self._count(r, 1)

    def pop(self) -> RouterRequest:
        r = self._q.popleft()
        self._count(r, -1)
        return r

    def remove(self, r: RouterRequest) -> None:
        self._q.remove(r)
        self._count(r, -1)

    def _count(self, r: RouterRequest, sign: int) -> None:
        self.num_tokens += sign * len(r.prompt)
        self._tokens_of[r.model] += sign * len(r.prompt)

    def pop_expired(self, now: float) -> list[RouterRequest]:
        """Requests that have waited longer than `max_wait_s` (oldest first), taken out."""
        if not self.max_wait_s:
            return []
        late = [r for r in self._q if now - r.queued_at > self.max_wait_s]
        for r in late:
            self.remove(r)
        return late
