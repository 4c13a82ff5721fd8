"""CPU workers sharing their node's cores.

On a GPU each instance has its own device and a step takes what the profile says. CPU
workers of one machine share its cores (the demo runs four workers, a router and a client
on two), and a step measured alone takes longer when more engines compute at once than
there are cores. `HostCores` stretches a step starting now by the share of the cores its
engine gets: busy engines on the node (this one included), plus any threads of other
work busy on it (`background`), over the cores, at least 1.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class HostCores:
    def __init__(self, cores: int, background: float = 0.0) -> None:
        self.cores = cores  # 0: unlimited (GPUs)
        self.background = background
        self.busy: set[int] = set()

    def stretch(self, rank: int) -> float:
        """How much longer than its profile a step of `rank` starting now takes."""
        if self.cores <= 0:
            return 1.0
        return max(1.0, (len(self.busy | {rank}) + self.background) / self.cores)

    @contextmanager
    def computing(self, rank: int) -> Iterator[None]:
        self.busy.add(rank)
        try:
            yield
        finally:
            self.busy.discard(rank)
