"""`blitzscale serve`: the serving cluster behind an OpenAI / TGI compatible HTTP API."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

POLICIES = ("blitz", "blitz-nolive", "network", "network-multicast", "sllm", "allcache", "fixed")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model on a local cluster of workers (HTTP API)")
    p.add_argument("--config", type=Path, default=None, help="cluster TOML file (flags override it)")
    p.add_argument(
        "--model",
        action="append",
        default=None,
        metavar="[NAME=]SOURCE",
        help="model name or path (default: smollm2-135m); repeat as NAME=SOURCE to serve several "
        "models on one pool (each request's `model` picks one)",
    )
    p.add_argument(
        "--keep-alive",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a model without a request this long scales to zero (default: never; every model's "
        "default, [[models]] keep_alive_s overrides it)",
    )
    p.add_argument(
        "--ttft-slo",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the time to first token to hold: the planner keeps each instance's queued prompt work "
        "within half of it (default: none, a band of 0.5-0.7 s; every model's default, [[models]] "
        "ttft_slo_s overrides it)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        metavar="SOURCE",
        help="another model's tokenizer (name or path) for every model, e.g. for a random:* model, "
        "which has none",
    )
    p.add_argument("--workers", type=int, default=None, help="worker processes (CPU) or GPUs used")
    p.add_argument(
        "--tp", type=int, default=None, help="tensor-parallel ranks per instance (workers: a multiple)"
    )
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=None,
        help="CPU worker processes or one a GPU ([cluster] device)",
    )
    p.add_argument(
        "--models-per-rank",
        type=int,
        default=None,
        help="models resident on each worker at once, each with its own engine and an equal share "
        "of the device (default 0: as many of the served models as fit a GPU, each with its weights "
        "and one request of its whole context; 1 on CPU workers; 1: another model is swapped in "
        "from its host copy)",
    )
    p.add_argument(
        "--cluster",
        choices=["local", "ray"],
        default=None,
        help="workers as local processes (default) or as Ray actors across a Ray cluster's nodes",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="with --cluster ray: the Ray cluster to join (auto, host:port); default: start one here",
    )
    p.add_argument("--policy", choices=POLICIES, default=None, help="scaling policy ([policy] name)")
    p.add_argument(
        "--mode",
        choices=["pd", "colocated"],
        default=None,
        help="prefill and decode on separate instances (pd) or together ([router] mode; default pd)",
    )
    p.add_argument("--host", default=None, help="HTTP address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="HTTP port (default 8000)")
    p.add_argument("--api-key", default=None, help="require this bearer token")
    p.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default info"
    )
    p.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="log lines as text or as one JSON object each (access lines carry their fields)",
    )
    p.add_argument("--no-access-log", action="store_true", help="no log line per HTTP request")
    p.add_argument(
        "--print-config", action="store_true", help="print the full configuration as TOML, then exit"
    )
    p.set_defaults(func=run)


def overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    def pick(**kv: Any) -> dict[str, Any]:
        return {k: v for k, v in kv.items() if v is not None}

    from blitzscale.serve.config import parse_model_flag

    values = args.model or []
    entries = [parse_model_flag(v) for v in values]
    single = len(values) == 1 and not entries[0].source  # a bare --model SOURCE: today's meaning
    return {
        "model": pick(
            name=values[0] if single else None,
            tp=args.tp,
            keep_alive_s=args.keep_alive,
            ttft_slo_s=args.ttft_slo,
            tokenizer=args.tokenizer,
        ),
        "models": [] if single else entries,
        "server": pick(host=args.host, port=args.port, api_key=args.api_key),
        "cluster": pick(
            num_workers=args.workers,
            device=args.device,
            backend=args.cluster,
            ray_address=args.ray_address,
            models_per_rank=args.models_per_rank,
        ),
        "router": pick(mode=args.mode),
        "policy": pick(name=args.policy),
    }


def run(args: argparse.Namespace) -> int:
    from blitzscale.api.access_log import ACCESS_LOGGER, JsonFormatter
    from blitzscale.errors import CheckpointError, InvalidRequestError
    from blitzscale.serve.checks import bind_http, check_serve_config
    from blitzscale.serve.config import load_serve_config

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    if args.log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    if args.workers is not None and args.workers < 1:
        raise InvalidRequestError(f"--workers must be at least 1, got {args.workers}")
    if args.models_per_rank is not None and args.models_per_rank < 0:
        raise InvalidRequestError(
            f"--models-per-rank must be >= 0 (0: as many as fit), got {args.models_per_rank}"
        )
    cfg = load_serve_config(args.config).with_overrides(**overrides(args))
    if args.print_config:
        print(cfg.to_toml())
        return 0
    check_serve_config(cfg)  # before anything starts (run_server checks again, for other callers)
    sock = bind_http(cfg.server.host, cfg.server.port)  # a port in use: refused now
    # (torch and the engine load only now: a bad flag or file is named in well under a second)
    from blitzscale.serve.model_cache import check_model_tp
    from blitzscale.serve.server import run_server

    for m in cfg.served_models():
        try:  # before any worker starts
            check_model_tp(m.spec, m.tp)
        except CheckpointError as e:
            raise InvalidRequestError(f"--tp {m.tp} with {m.spec}: {e}") from e
    access = None if args.no_access_log else logging.getLogger(ACCESS_LOGGER)
    # A SIGTERM before uvicorn takes the signals (while workers start: seconds) stops the
    # server as a KeyboardInterrupt, through run_server's cleanup, which stops the workers
    # (exit code 130); its default action ended this process alone, leaving the workers and
    # the forkserver running. (uvicorn's own handler takes it while serving: exit code 0.)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    asyncio.run(run_server(cfg, access, sock))
    return 0
