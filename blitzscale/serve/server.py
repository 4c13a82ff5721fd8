"""Putting the serving cluster together: workers, router, scaler and the HTTP edge.

`ServingCluster` is the whole service in one object: `start()` launches the workers and
brings up the first instances, `app` is the FastAPI application, `stop()` ends everything.
`run_server` serves it with uvicorn until Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import socket
import threading
from collections.abc import Iterator
from typing import Any

import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry

from blitzscale.checkpoint import load_config, load_tokenizer, resolve_model
from blitzscale.checkpoint.resolve import hf_id
from blitzscale.cluster.local import LocalCluster
from blitzscale.cluster.slotted import slotted
from blitzscale.cluster.spawners import make_spawner
from blitzscale.control.costmodel import Profile
from blitzscale.core.heap import freeze_heap
from blitzscale.core.progress import Phase
from blitzscale.serve.checks import bind_http, check_serve_config, first_instances
from blitzscale.serve.config import ModelEntry, ServeConfig
from blitzscale.serve.controlplane import ControlPlane, ControlPlaneSpec, build_control_plane
from blitzscale.serve.costs import cost_models, models_per_rank, profile_file, shape_reports
from blitzscale.serve.dataplane import ZmqDataPlane
from blitzscale.serve.metrics import ClusterMetrics
from blitzscale.serve.model_cache import borrowed_tokenizer, check_model_tp, prepare_model, with_tokenizer
from blitzscale.serve.models import ScaledModel, ServedModel
from blitzscale.serve.router import Router
from blitzscale.serve.scaler import Scaler
from blitzscale.worker.pacing import resolve_pace
from blitzscale.worker.standby import StandbySpec

log = logging.getLogger("blitzscale.serve")


def _served_model(m: ModelEntry, folder: str, cfg: ServeConfig, cost: Profile | None = None) -> ServedModel:
    """What the router needs of a model: tokenizer, vocabulary, context, cost model."""
    src = resolve_model(folder)
    mcfg = load_config(src)
    limit = mcfg.max_position_embeddings
    keep = m.keep_alive_s if m.keep_alive_s is not None else cfg.model.keep_alive_s
    return ServedModel(
        name=m.name,
        tokenizer=load_tokenizer(src),
        vocab_size=mcfg.vocab_size,
        max_model_len=min(cfg.engine.max_model_len or limit, limit),
        root=hf_id(m.spec),
        # (several models: one may start at zero, or be reclaimed to it, and still serve)
        may_idle_at_zero=m.min_instances == 0 and (math.isfinite(keep) or len(cfg.models) > 1),
        cost=cost,
        max_num_seqs=cfg.engine.for_device(cfg.cluster.device).max_num_seqs,
        prefix_block_size=cfg.engine.block_size if cfg.engine.prefix_caching else 0,
        ttft_slo_s=_ttft_slo_s(m, cfg),
    )


def _ttft_slo_s(m: ModelEntry, cfg: ServeConfig) -> float:
    """A model's TTFT SLO: its own, else `[model] ttft_slo_s` (the router plans live
    splits and moves by it, the planner its band)."""
    return m.ttft_slo_s if m.ttft_slo_s is not None else cfg.model.ttft_slo_s


def _scaled_model(m: ModelEntry, folder: str, cfg: ServeConfig) -> ScaledModel:
    """What the scaler needs of a model: where workers load it from, its bounds."""
    keep = m.keep_alive_s if m.keep_alive_s is not None else cfg.model.keep_alive_s
    slo = _ttft_slo_s(m, cfg)
    return ScaledModel(m.name, folder, folder, m.min_instances, m.max_instances, keep, slo)


class ServingCluster:
    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.registry = CollectorRegistry()
        self.cluster: Any = None  # a LocalCluster, or its slots (cluster/slotted.py)
        self.control: ControlPlane | None = None  # router, scaler, metrics: once started
        self._ctx = zmq.asyncio.Context()

    async def start(self) -> None:
        cfg = self.cfg
        tp = cfg.model.tp
        models = cfg.served_models()
        pace = resolve_pace(cfg.engine.pace, cfg.cluster.num_workers)  # (a bad value: before any worker)
        borrowed = {}
        for m in models:
            await asyncio.to_thread(check_model_tp, m.spec, tp)
            if m.tokenizer:  # (a bad one is refused before a model is converted)
                borrowed[m.name] = await asyncio.to_thread(borrowed_tokenizer, m.spec, m.tokenizer)
        folders = {}
        for m in models:  # (converted once and kept: a first start writes the whole model)
            with Phase(f"preparing {m.spec} in our format") as phase:
                folders[m.name] = await asyncio.to_thread(
                    prepare_model, m.spec, cfg.model.cache_dir, tp, phase.report, cfg.cluster.resolved_dtype
                )
            if m.tokenizer:
                folders[m.name] = await asyncio.to_thread(
                    with_tokenizer, folders[m.name], m.tokenizer, borrowed[m.name]
                )
        default = models[0]
        folder = folders[default.name]
        given = profile_file(cfg)  # (a bad file is refused before any worker starts)
        engine = cfg.engine.for_device(cfg.cluster.device)  # what every worker is told
        # (models resident per rank: derived once the workers say their device, below)
        engine = dataclasses.replace(engine, models_per_device=max(1, cfg.cluster.models_per_rank))
        # The workers' backend (local processes, or Ray actors) says which address they reach
        # this process at: the router's data socket is bound there.
        spawner = make_spawner(cfg.cluster)
        host = await asyncio.to_thread(spawner.connect, cfg.cluster.host)
        data = self._ctx.socket(zmq.ROUTER)
        data.setsockopt(zmq.LINGER, 0)
        port = data.bind_to_random_port(f"tcp://{host}")
        use_standby = cfg.cluster.uses_standby and tp == 1  # (TP instances: not yet)
        standby = StandbySpec(default.name, folder, engine) if use_standby else None
        addr = f"tcp://{host}:{port}"
        local = LocalCluster(
            cfg.cluster, data_addr=addr, tokenizer_source=folder, standby=standby, tp=tp, spawner=spawner
        )
        self.cluster = local
        try:
            what = "standby engines, kernels, CUDA graphs" if standby is not None else "links"
            with Phase(f"starting {cfg.cluster.num_workers} workers ({what})"):
                await asyncio.to_thread(local.start)
        except BaseException:
            self.cluster = None  # start() stopped what it began (the spawner's too)
            raise
        try:
            shapes = await shape_reports(local, cfg, models, folders, engine)
            per_rank = models_per_rank(cfg, shapes, engine)
            if per_rank != engine.models_per_device:
                engine = dataclasses.replace(engine, models_per_device=per_rank)
                log.info(
                    "%d models resident per rank (as many as fit: [cluster] models_per_rank = 0)", per_rank
                )
                with Phase("building the standby engines again for their share of the device"):
                    await local.set_standby_engine(engine)
            self.cluster = slotted(local, per_rank)  # (several models a worker: its slots)
            if pace is not None:  # paced workers are the reference device: its profile is their cost
                costs: dict[str, Profile | None] = {m.name: pace for m in models}
            else:
                with Phase("the cost model: measured on a worker, or read back"):
                    costs = await cost_models(self.cluster, cfg, models, folders, engine, shapes, given)
        except BaseException:
            await asyncio.to_thread(self.cluster.stop)
            self.cluster = None
            raise
        served = [
            await asyncio.to_thread(_served_model, m, folders[m.name], cfg, costs[m.name]) for m in models
        ]
        spec = ControlPlaneSpec(
            router=cfg.router,
            planner=cfg.planner,
            policy=cfg.policy,
            engine=engine,
            served=served,
            scaled=[_scaled_model(m, folders[m.name], cfg) for m in models],
            first_instances=first_instances(cfg),
            tp=tp,
            pace=pace,
            registry=self.registry,
        )
        if pace is not None:
            log.info("pacing every engine step by %s (%s): the cost model of all", pace.name, pace.device)
        with Phase("loading the first instances"):
            self.control = await build_control_plane(
                spec, self.cluster, ZmqDataPlane(data, local.token, local.world_size)
            )
        self.control.start_scaling()

    @property
    def router(self) -> Router | None:
        return self.control.router if self.control is not None else None

    @property
    def scaler(self) -> Scaler | None:
        return self.control.scaler if self.control is not None else None

    @property
    def metrics(self) -> ClusterMetrics | None:
        return self.control.metrics if self.control is not None else None

    def app(self, access_log: Any = None) -> Any:
        from blitzscale.api.app import create_app

        assert self.router is not None
        server = self.cfg.server
        return create_app(
            self.router,
            api_key=server.api_key or None,
            registry=self.registry,
            max_body_bytes=server.max_body_bytes,
            access_log=access_log,
        )

    async def stop(self) -> None:
        if self.control is not None:
            await self.control.stop()
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.stop)
        self._ctx.destroy(linger=0)


# After a second Ctrl-C, the requests still running have this long to send their 503
# before the exit is forced.
SECOND_SIGNAL_FORCE_S = 1.0


def _quiet_server(config: Any, stopping: asyncio.Event | None = None) -> Any:
    """A uvicorn server that stops on SIGINT / SIGTERM and then returns normally (uvicorn
    re-raises the signal after its shutdown, which would cut our own shutdown short).
    `stopping` (the app's) is set just before the graceful shutdown's time is up: requests
    still running end with a 503 (a stream with its error event) instead of being cancelled
    under uvicorn with a traceback and a cut connection."""
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            grace = self.config.timeout_graceful_shutdown or 0.0
            if stopping is not None:
                asyncio.get_running_loop().call_later(max(0.0, grace - min(1.0, grace / 2)), stopping.set)
            await super().shutdown(sockets)

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit and sig == signal.SIGINT and stopping is not None and not stopping.is_set():
                # A second Ctrl-C: the requests still running end now, as at the grace
                # period's end (a 503; a stream: its error event and [DONE]), and the exit
                # is forced a moment later if a connection lingers. uvicorn forced it at
                # once: cancelled handlers answered a plain-text 500 and cut the streams.
                loop = asyncio.get_running_loop()
                loop.call_soon_threadsafe(stopping.set)
                force = functools.partial(uvicorn.Server.handle_exit, self, sig, frame)
                loop.call_soon_threadsafe(loop.call_later, SECOND_SIGNAL_FORCE_S, force)
                return
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield  # signals belong to the main thread's owner
                return
            old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in old.items():
                    signal.signal(s, h)

    return Server(config)


async def _announce(server: Any, cfg: ServeConfig) -> None:
    """ "serving on ..." once uvicorn has taken the (already bound) socket and serves."""
    while not server.started:
        await asyncio.sleep(0.05)
    names = ", ".join(m.name for m in cfg.served_models())
    log.info("serving %s on http://%s:%d", names, cfg.server.host, cfg.server.port)


async def run_server(cfg: ServeConfig, access_log: Any = None, sock: socket.socket | None = None) -> None:
    """Check the configuration and bind the port before any worker starts (`sock`: bound
    already), then serve until SIGINT / SIGTERM. `access_log`: a logging.Logger for one
    line per request."""
    import uvicorn

    check_serve_config(cfg)
    if sock is None:
        sock = bind_http(cfg.server.host, cfg.server.port)
    service = ServingCluster(cfg)
    try:
        await service.start()
        app = service.app(access_log)
        server = _quiet_server(
            uvicorn.Config(
                app,
                host=cfg.server.host,
                port=cfg.server.port,
                log_level="warning",
                access_log=False,  # ours (api/access_log.py) has status, duration and tokens
                timeout_graceful_shutdown=cfg.server.shutdown_timeout_s,
            ),
            app.state.stopping,
        )
        announce = asyncio.create_task(_announce(server, cfg))
        freeze_heap()  # (the server's modules, app and control plane: long-lived)
        try:
            await server.serve(sockets=[sock])  # returns on SIGINT / SIGTERM
        finally:
            announce.cancel()
    finally:
        sock.close()
        await service.stop()
