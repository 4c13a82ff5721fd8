"""The control plane, built one way for every cluster: a live server's workers and the
simulator's virtual GPUs get the same router, scaler, planner, policies and models.

`build_control_plane` takes what differs between the two (the cluster behind the
`Cluster` interface, the data plane the router sends requests through, and the models as
the router and the scaler see them) and does the rest in one order: the router and its
models, the metrics, the scaler and its models, then each model's first instances while
ranks last (the others start at zero: their first request brings them up). `serve`
(serve/server.py) and `simulate` (sim/runner.py) both call it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from blitzscale.cluster.base import Cluster
from blitzscale.control.config import PlannerConfig, PolicyConfig
from blitzscale.control.costmodel import Profile
from blitzscale.core.config import EngineConfig
from blitzscale.errors import InvalidRequestError
from blitzscale.serve.dataplane import DataPlane
from blitzscale.serve.metrics import ClusterMetrics
from blitzscale.serve.models import ScaledModel, ServedModel
from blitzscale.serve.router import Router, RouterConfig
from blitzscale.serve.scaler import Scaler

log = logging.getLogger("blitzscale.serve")


@dataclass(frozen=True)
class ControlPlaneSpec:
    """Everything the control plane is made of, beside its cluster and data plane."""

    router: RouterConfig
    planner: PlannerConfig
    policy: PolicyConfig
    engine: EngineConfig  # what every worker's engine is told
    served: Sequence[ServedModel]  # the router's view of each model; the first is the default
    scaled: Sequence[ScaledModel]  # the scaler's, in the same order
    first_instances: tuple[int, int]  # (prefill or colocated, decode) instances of each model at start
    tp: int = 1  # ranks per instance
    pace: Profile | None = None  # paced workers' reference device (worker/pacing.py)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        names = [m.name for m in self.served]
        if not names or names != [m.name for m in self.scaled]:
            raise ValueError(f"served {names} and scaled {[m.name for m in self.scaled]} models must match")


@dataclass
class ControlPlane:
    router: Router
    scaler: Scaler
    metrics: ClusterMetrics
    _scaling: asyncio.Task[None] | None = None

    def start_scaling(self) -> None:
        """Run the scaler's loop (under a fixed policy too, which never scales but loads
        again an instance it lost: `policies.fixed_actions`)."""
        if self._scaling is None:
            self._scaling = asyncio.create_task(self.scaler.run())

    async def pause_scaling(self) -> None:
        """Stop the scaler's loop (`start_scaling` runs it again): no round plans anything,
        instances stay as they are (a test that needs a cluster left short, say)."""
        if self._scaling is not None:
            self._scaling.cancel()
            await asyncio.gather(self._scaling, return_exceptions=True)
            self._scaling = None

    async def stop(self) -> None:
        await self.pause_scaling()
        await self.scaler.stop()
        await self.router.stop()


async def build_control_plane(spec: ControlPlaneSpec, cluster: Cluster, data: DataPlane) -> ControlPlane:
    """The router and scaler over `cluster`, each model's first instances up; the scaler's
    loop is not running yet (`start_scaling`). Raises InvalidRequestError, before any
    instance is loaded, if the first instances of one model need more ranks than exist."""
    n_pre, n_dec = spec.first_instances
    need = (n_pre + n_dec) * spec.tp
    if need > cluster.world_size:
        raise InvalidRequestError(
            f"{n_pre + n_dec} first instances of tp={spec.tp} need {need} ranks, "
            f"the cluster has {cluster.world_size}"
        )
    first = spec.served[0]
    router = Router(
        spec.router, cluster, data, first.tokenizer, first.name, first.vocab_size, first.max_model_len,
        tp=spec.tp,
    )  # fmt: skip
    for m in spec.served:  # (the default one again: with its root, cost model and keep-alive)
        router.add_model(m)
    router.model_root = first.root
    await router.start()
    metrics = ClusterMetrics(spec.registry, router)
    d = spec.scaled[0]
    scaler = Scaler(
        router, spec.planner, spec.policy, d.name, d.source, d.disk_source, spec.engine, metrics,
        pace=spec.pace,
    )  # fmt: skip
    for m in spec.scaled:
        scaler.add_model(m)
    plane = ControlPlane(router, scaler, metrics)
    try:
        await _first_instances(plane, spec, cluster.world_size, need)
    except BaseException:
        await plane.stop()
        raise
    return plane


async def _first_instances(plane: ControlPlane, spec: ControlPlaneSpec, world: int, need: int) -> None:
    """Each model's first instances while ranks last, in order; the rest start at zero."""
    n_pre, n_dec = spec.first_instances
    keep_host = spec.policy.name != "fixed"  # (tp > 1: each shard keeps its own in host memory)
    start = 0
    for m in spec.scaled:
        if start + need > world:
            log.info("model %s starts at zero: its first request brings it up", m.name)
            continue
        await plane.scaler.bootstrap(n_pre, n_dec, keep_host_copy=keep_host, model=m.name, first=start)
        start += need
