"""The simulated machines' links: NVLink domains (one per node), a NIC per GPU on a
non-blocking leaf-spine network, a PCIe link per GPU to its host, an SSD per node.

Links are shared fairly: a transfer or KV migration that starts while others use one of
its links gets an equal share of it, fixed when it starts (a flow-level approximation:
later arrivals do not slow flows already running).
"""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    nodes: int
    gpus_per_node: int
    nvlink_bytes_per_s: float  # one GPU's NVLink bandwidth to a peer in its node (0: none)
    nic_bytes_per_s: float  # one GPU's RDMA NIC (each direction)
    pcie_bytes_per_s: float  # one GPU's PCIe link to host memory and to peers without NVLink (each direction)
    ssd_bytes_per_s: float  # one node's SSD read bandwidth
    latency_s: float = 10e-6  # per message on any link
    # CPU workers share their node's cores: with more engines busy at once than cores, each
    # step takes proportionally longer (sim/cores.py). 0: each worker has its own device.
    cores_per_node: int = 0
    # Threads of other work busy on each node's cores meanwhile (a loaded test machine;
    # `blitzscale bench fidelity --calibrate` measures it); they share the cores too.
    background_threads: float = 0.0

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(f"nodes and gpus_per_node must be >= 1, got {self.nodes} x {self.gpus_per_node}")
        for name in ("nic_bytes_per_s", "pcie_bytes_per_s", "ssd_bytes_per_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.cores_per_node < 0:
            raise ValueError(f"cores_per_node must be >= 0 (0: no sharing), got {self.cores_per_node}")
        if self.background_threads < 0:
            raise ValueError(f"background_threads must be >= 0, got {self.background_threads}")
        if self.nvlink_bytes_per_s < 0:
            raise ValueError(f"nvlink_bytes_per_s must be >= 0, got {self.nvlink_bytes_per_s}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def path(self, a: int, b: int) -> list[tuple[tuple[str, int], float]]:
        """The links a GPU-to-GPU stream from `a` to `b` crosses, with their bandwidth."""
        if self.node_of(a) == self.node_of(b):
            if self.nvlink_bytes_per_s:
                return [
                    (("nvlink-out", a), self.nvlink_bytes_per_s),
                    (("nvlink-in", b), self.nvlink_bytes_per_s),
                ]
            # PCIe is full duplex, as NVLink and the NIC are: a chain's relay receives and
            # forwards at the link's rate both ways
            return [(("pcie-out", a), self.pcie_bytes_per_s), (("pcie-in", b), self.pcie_bytes_per_s)]
        return [(("nic-out", a), self.nic_bytes_per_s), (("nic-in", b), self.nic_bytes_per_s)]


class Links:
    """Which links are in use now; a flow's bandwidth is its fair share when it starts."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._active: Counter[tuple[str, int]] = Counter()

    def rate(
        self, links: list[tuple[tuple[str, int], float]], own: Counter[tuple[str, int]] | None = None
    ) -> float:
        """Bytes per second a new flow over `links` gets; `own`: flows of the same
        operation on each link (its stripes share a target's inbound link)."""
        own = own or Counter()
        return min(bw / (self._active[key] + max(1, own[key])) for key, bw in links)

    @contextlib.contextmanager
    def using(self, links: list[tuple[tuple[str, int], float]]) -> Iterator[None]:
        keys = [key for key, _ in links]
        self._active.update(keys)
        try:
            yield
        finally:
            self._active.subtract(keys)

    # --- the flows the cluster makes --------------------------------------------------------

    def chain_links(self, chains: list[list[int]]) -> list[tuple[tuple[str, int], float]]:
        return [link for c in chains for a, b in itertools.pairwise(c) for link in self.topo.path(a, b)]

    @staticmethod
    def chains(sources: list[int], targets: list[int]) -> list[list[int]]:
        """Chain j carries stripe j from source j through every target, from a rotated start."""
        return [[s, *targets[j:], *targets[:j]] for j, s in enumerate(sources)] if targets else []

    def multicast_seconds(self, sources: list[int], targets: list[int], nbytes: int, piece: int) -> float:
        """Chain multicast from `sources` (stripes) through every target, pipelined by
        pieces: the slowest chain's stripe plus one piece per further hop. A target takes
        every stripe, so the stripes share its inbound link."""
        k = max(1, len(sources))
        chains = self.chains(sources, targets)
        own = Counter(key for key, _ in self.chain_links(chains))
        worst = 0.0
        for c in chains:
            links = self.chain_links([c])
            rate = self.rate(links, own)
            hops = len(c) - 1
            worst = max(
                worst, (nbytes / k) / rate + (hops - 1) * (piece / k) / rate + hops * self.topo.latency_s
            )
        return worst

    def host_links(self, holder: int, target: int, local: bool) -> list[tuple[tuple[str, int], float]]:
        """Host memory -> `target`: its own host over PCIe (`local`, a per-host cache), or
        the holder's host across the network (the one host copy)."""
        t = self.topo
        links = [(("pcie-in", target), t.pcie_bytes_per_s)]
        if not local and t.node_of(holder) != t.node_of(target):
            links += [(("nic-out", holder), t.nic_bytes_per_s), (("nic-in", target), t.nic_bytes_per_s)]
        return links

    def disk_links(self, target: int) -> list[tuple[tuple[str, int], float]]:
        t = self.topo
        return [(("ssd", t.node_of(target)), t.ssd_bytes_per_s), (("pcie-in", target), t.pcie_bytes_per_s)]
