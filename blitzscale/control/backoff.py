"""Which ranks a load may target now: a rank whose load failed waits before the next try
(doubling each time), and one that failed `max_failures` loads in a row is taken out of
service, rather than retried every planner round for ever. A load refused for want of
device memory (`no_room`) is not the rank's fault: it waits `base_s` and tries again,
without counting toward out-of-service. Pure bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoadBackoff:
    base_s: float = 1.0  # wait after the first failure; doubles with each one after it
    max_s: float = 60.0
    max_failures: int = 3  # in a row; then the rank is out of service (0: never)
    _failures: dict[int, int] = field(default_factory=dict)
    _until: dict[int, float] = field(default_factory=dict)
    out_of_service: set[int] = field(default_factory=set)
    num_failed: int = 0  # failed loads, all ranks

    def may_load(self, rank: int, now: float) -> bool:
        return rank not in self.out_of_service and now >= self._until.get(rank, 0.0)

    def failed(self, rank: int, now: float) -> bool:
        """A load onto `rank` failed; True if that takes the rank out of service."""
        self.num_failed += 1
        n = self._failures.get(rank, 0) + 1
        self._failures[rank] = n
        self._until[rank] = now + min(self.max_s, self.base_s * 2 ** (n - 1))
        if self.max_failures and n >= self.max_failures and rank not in self.out_of_service:
            self.out_of_service.add(rank)
            return True
        return False

    def no_room(self, rank: int, now: float) -> None:
        """A load onto `rank` found too little device memory: it waits `base_s`, uncounted."""
        self._until[rank] = max(self._until.get(rank, 0.0), now + self.base_s)

    def succeeded(self, rank: int) -> None:
        self._failures.pop(rank, None)
        self._until.pop(rank, None)

    def fresh(self, rank: int) -> None:
        """`rank` is a new process now (respawned): its history is not its own."""
        self.succeeded(rank)
        self.out_of_service.discard(rank)
