"""What `blitzscale serve` checks before any worker starts, so a bad value is one line
naming it and what is allowed, never a traceback from a worker or the HTTP server later."""

from __future__ import annotations

import importlib.util
import os
import socket
from typing import TYPE_CHECKING

from blitzscale.errors import InvalidRequestError, ModelNotFoundError
from blitzscale.model.config import DTYPE_BYTES
from blitzscale.serve.config import ServeConfig
from blitzscale.worker.pacing import resolve_pace

if TYPE_CHECKING:
    from blitzscale.checkpoint.resolve import ModelSource

MAX_PORT = 65535


def first_instances(cfg: ServeConfig) -> tuple[int, int]:
    """(prefill or colocated, decode) instances the service brings up at start."""
    fixed = cfg.policy.name == "fixed"
    n_pre = cfg.policy.fixed_prefill if fixed else cfg.planner.min_prefill
    n_dec = (cfg.policy.fixed_decode if fixed else cfg.planner.min_decode) if cfg.router.mode == "pd" else 0
    return n_pre, n_dec


def check_serve_config(cfg: ServeConfig) -> None:
    """Ports in range, enough workers for the first instances of the mode and policy, a
    model that resolves, Ray installed for the ray backend. Raises InvalidRequestError
    naming the value."""
    from blitzscale.checkpoint import resolve_model

    _check_port("[server] port (--port)", cfg.server.port, lo=1)
    _check_host("[server] host (--host)", cfg.server.host)
    _check_host("[cluster] host", cfg.cluster.host)
    _check_port("[cluster] dist_port", cfg.cluster.dist_port, lo=0)
    _check_port("[cluster] control_port", cfg.cluster.control_port, lo=0)
    n_pre, n_dec = first_instances(cfg)
    workers, tp = cfg.cluster.num_workers, cfg.model.tp
    if (n_pre + n_dec) * tp > workers:
        source = (
            "[policy] fixed_prefill + fixed_decode"
            if cfg.policy.name == "fixed"
            else "[planner] min_prefill + min_decode"
        )
        mode = f"mode {cfg.router.mode!r}"
        hint = " (or --mode colocated)" if cfg.router.mode == "pd" else ""
        need = (n_pre + n_dec) * tp
        of_tp = f" of tp={tp} ({need} workers)" if tp > 1 else ""
        raise InvalidRequestError(
            f"{mode} starts {n_pre + n_dec} instances{of_tp} ({source}) but there are {workers} workers "
            f"(--workers / [cluster] num_workers): use --workers {need} or more{hint}"
        )
    _check_model_bounds(cfg)
    resolve_pace(cfg.engine.pace, cfg.cluster.num_workers)  # InvalidRequestError names it
    sources: list[ModelSource] = []
    for m in cfg.served_models():  # ModelNotFoundError names it
        try:
            sources.append(resolve_model(m.spec))
        except ModelNotFoundError as e:
            where = f"[[models]] {m.name!r} source" if cfg.models else "[model] name (--model)"
            raise ModelNotFoundError(f"{where}: {e}") from e
        if m.tokenizer:
            try:
                resolve_model(m.tokenizer)
            except ModelNotFoundError as e:  # (a name or path of another model, as vLLM's)
                named = (
                    f"[[models]] {m.name!r} tokenizer" if cfg.models else "[model] tokenizer (--tokenizer)"
                )
                raise ModelNotFoundError(f"{named}: {e}") from e
    if cfg.cluster.backend == "ray" and importlib.util.find_spec("ray") is None:
        raise InvalidRequestError(
            "--cluster ray ([cluster] backend = \"ray\") needs Ray: pip install 'blitzscale[ray]'"
        )
    _check_cpu_workers_fit(cfg, sources)  # last: reading the models' configs imports torch (seconds)


def _check_cpu_workers_fit(cfg: ServeConfig, sources: list[ModelSource]) -> None:
    """CPU workers on this machine (the local backend) each hold at least one model's
    weights in host memory: a worker count whose weights alone exceed the machine's memory
    (`--workers 500`) is refused here, not found by the kernel's OOM killer mid-start. A GPU
    worker is one a visible GPU (cluster/spawn.py caps those); Ray's live on other hosts."""
    cl = cfg.cluster
    if cl.device != "cpu" or cl.backend != "local":
        return
    from blitzscale.checkpoint import load_config
    from blitzscale.model.layout import build_layout

    itemsize = DTYPE_BYTES[cl.dtype or "float32"]
    largest = max(build_layout(load_config(src), itemsize, cfg.model.tp).nbytes for src in sources)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if cl.num_workers * largest > memory:
        raise InvalidRequestError(
            f"--workers / [cluster] num_workers = {cl.num_workers}: each CPU worker holds a model's weights "
            f"({largest / 1e9:.2f} GB a rank), {cl.num_workers * largest / 1e9:.1f} GB in all, more than "
            f"this machine's {memory / 1e9:.1f} GB; use at most {max(1, memory // largest)}"
        )


def _check_host(where: str, host: str) -> None:
    """An address this machine can bind or reach: a name that does not resolve is named
    here, not found by ZeroMQ or uvicorn after workers started."""
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError) as e:
        raise InvalidRequestError(f"{where}: {host!r} does not resolve to an address ({e})") from None


def _check_model_bounds(cfg: ServeConfig) -> None:
    """Each model's instance bounds against the workers and the mode."""
    workers, tp = cfg.cluster.num_workers, cfg.model.tp
    if cfg.policy.name == "fixed" and len(cfg.models) > 1:
        n_pre, n_dec = first_instances(cfg)
        need = len(cfg.models) * (n_pre + n_dec) * tp
        if need > workers:
            raise InvalidRequestError(
                f"policy 'fixed' never scales, so each of the {len(cfg.models)} models needs its "
                f"first instances at start: {need} workers, there are {workers} (use another policy, "
                "or more workers)"
            )
    for m in cfg.models:
        if m.min_instances * tp > workers:
            raise InvalidRequestError(
                f"[[models]] {m.name!r}: min_instances={m.min_instances} needs {m.min_instances * tp} "
                f"workers, there are {workers}"
            )
        if cfg.router.mode == "pd" and m.max_instances == 1:
            raise InvalidRequestError(
                f"[[models]] {m.name!r}: max_instances=1 cannot hold a prefill and a decode instance "
                "(mode 'pd'): use 2 or more, 0 (no bound), or --mode colocated"
            )


def _check_port(name: str, port: int, lo: int) -> None:
    if not lo <= port <= MAX_PORT:
        raise InvalidRequestError(f"{name} must be in [{lo}, {MAX_PORT}], got {port}")


def bind_http(host: str, port: int) -> socket.socket:
    """The HTTP server's listening socket, bound now (before any worker starts) so a port in
    use or an address that is not this host's is refused at once."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise InvalidRequestError(f"[server] host (--host) {host!r} does not resolve: {e.strerror}") from e
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise InvalidRequestError(
            f"cannot listen on {host}:{port} ([server] host / port): {e.strerror}"
        ) from e
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
