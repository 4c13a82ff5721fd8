"""`blitzscale simulate` (our control plane on a simulated cluster) and `blitzscale profile`
(the step times it runs on, measured here)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from blitzscale.cli.common import check_device
from blitzscale.control.config import PolicyConfig
from blitzscale.errors import InvalidRequestError

TRACE_FORMATS = {"azure": "azure", "burstgpt": "burstgpt", "mooncake": "mooncake", "csv": "processed"}


_MEASURE_DEFAULTS: dict[str, Any] = {
    "model": "smollm2-135m",
    "device": "cpu",
    "batches": "1,4,16,64",
    "contexts": "128,512,1024",
    "prefill": "16,128,512,1024,2048",
    "steps": 4,
    "threads": 1,
}
_DERIVE_FLAGS = ("bandwidth_factor", "flops_factor", "memory_bytes", "name", "device_name")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="run our control plane against a simulated cluster on a virtual clock",
        description="Replay a trace against simulated GPUs: the real router, planner and policies "
        "decide; instances, links and disks take the time their profiles say. Writes "
        "OUT/<policy>/{requests.jsonl,summary.json,report.html} and OUT/comparison.json.",
    )
    p.add_argument("--preset", default="paper-a", help="cluster preset name or .toml (default paper-a)")
    p.add_argument("--model", default="llama3-8b", help="model the preset has a profile for")
    p.add_argument("--trace", required=True, help="trace file")
    p.add_argument("--format", default="azure", help=f"trace format: {', '.join(TRACE_FORMATS)}")
    p.add_argument("--policy", default="blitz,sllm", help="comma-separated policies (default blitz,sllm)")
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--duration", type=float, help="only requests arriving in the first S seconds")
    p.add_argument("--rate-scale", type=float, default=1.0, help="scale the request rate (default 1)")
    p.add_argument("--time-scale", type=float, default=1.0, help="divide timestamps by X (default 1)")
    p.add_argument("--max-input", type=int, help="clamp prompts to N tokens (default: half the context)")
    p.add_argument("--max-output", type=int, help="clamp outputs to N tokens (default: half the context)")
    p.add_argument(
        "--planner",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a [planner] knob over the profile-derived defaults (repeatable), e.g. prefill_upper=0.5",
    )
    p.add_argument(
        "--mode",
        default="pd",
        choices=["pd", "colocated"],
        help="prefill and decode on separate instances (pd) or together (colocated)",
    )
    p.add_argument(
        "--models",
        type=int,
        default=1,
        help="models on the pool (the model under N names), each with its own slice of the trace, "
        "replayed twice (default 1)",
    )
    p.add_argument(
        "--keep-alive", type=float, default=None, help="--models > 1: idle seconds before zero (default 5)"
    )
    p.add_argument(
        "--models-per-rank",
        type=int,
        default=None,
        help="--models > 1: models resident on each GPU at once, each with an equal share of it "
        "(default 0: as many as fit, each with its weights and one request of its whole context)",
    )
    p.add_argument(
        "--host-memory-gb",
        type=float,
        default=None,
        help="--models > 1: host memory per host for copies (0: no bound)",
    )
    p.add_argument(
        "--ttft-slo", type=float, help="TTFT SLO in seconds, judged and planned for (default: the model's)"
    )
    p.add_argument("--tbt-slo", type=float, help="TBT SLO in seconds (default: the model's)")
    p.add_argument(
        "--no-prefix-caching", action="store_true", help="engines cache no prompt prefixes (on by default)"
    )
    p.add_argument(
        "--no-prefix-routing", action="store_true", help="the router ignores cached prefixes (on by default)"
    )
    p.add_argument(
        "--hot-prefix-share",
        type=float,
        default=PolicyConfig.hot_prefix_share,
        help="share of a new instance's KV cache its source's most reused cached prefixes may fill, "
        "shipped with the weights (default %(default)s; 0: new instances start empty)",
    )
    p.add_argument(
        "--live-split",
        default="greedy",
        help="how a loading live target's prompts are split with its partner: greedy (ZigZag's rule) "
        "or ilp (an integer program plans each prompt's layers; default greedy)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_simulate)

    q = sub.add_parser(
        "profile",
        help="measure our engine's prefill and decode step times (the simulator's cost model)",
    )
    # The measurement's flags default to None so that --derive can refuse them by name.
    q.add_argument("--model", help=f"the model to measure (default {_MEASURE_DEFAULTS['model']})")
    q.add_argument("--device", choices=["cpu", "cuda"], help="where to measure (default cpu)")
    q.add_argument("--out", required=True, help="profile JSON file to write")
    q.add_argument("--batches", help=f"decode batch sizes (default {_MEASURE_DEFAULTS['batches']})")
    q.add_argument("--contexts", help=f"decode contexts, tokens (default {_MEASURE_DEFAULTS['contexts']})")
    q.add_argument("--prefill", help=f"prefill lengths, tokens (default {_MEASURE_DEFAULTS['prefill']})")
    steps = _MEASURE_DEFAULTS["steps"]
    q.add_argument("--steps", type=int, help=f"decode steps timed a cell (default {steps})")
    q.add_argument("--threads", type=int, help="CPU: torch threads (default 1, as each CPU worker runs)")
    q.add_argument(
        "--derive",
        metavar="PROFILE",
        help="measure nothing: scale PROFILE to another device by --bandwidth-factor (decode) and "
        "--flops-factor (prefill), with --memory-bytes and --name",
    )
    q.add_argument("--bandwidth-factor", type=float, help="target / measured memory bandwidth")
    q.add_argument("--flops-factor", type=float, help="target / measured bf16 FLOP rate")
    q.add_argument("--memory-bytes", type=float, help="the target device's memory")
    q.add_argument("--name", help="the derived profile's name (<model>-<device>)")
    q.add_argument("--device-name", help="the derived profile's device, in words")
    q.set_defaults(func=run_profile)


def _ints(flag: str, text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise InvalidRequestError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals) or list(vals) != sorted(set(vals)):
        raise InvalidRequestError(f"{flag} must be increasing positive integers, got {text!r}")
    return vals


def run_profile(args: argparse.Namespace) -> int:
    given = [_flag(n) for n in _MEASURE_DEFAULTS if getattr(args, n) is not None]
    if args.derive:
        if given:  # a derived profile measures nothing: these would be ignored
            raise InvalidRequestError(f"--derive measures nothing; drop {', '.join(given)}")
        return _derive(args)
    stray = [_flag(n) for n in _DERIVE_FLAGS if getattr(args, n) is not None]
    if stray:
        raise InvalidRequestError(f"{', '.join(stray)} only with --derive PROFILE")
    for n, v in _MEASURE_DEFAULTS.items():
        if getattr(args, n) is None:
            setattr(args, n, v)
    check_device(args.device)
    for flag, v in (("--steps", args.steps), ("--threads", args.threads)):
        if v < 1:
            raise InvalidRequestError(f"{flag} must be >= 1, got {v}")
    from blitzscale.bench.profile import ProfileConfig, measure_profile

    if args.device == "cpu":
        import torch

        torch.set_num_threads(args.threads)

    cfg = ProfileConfig(
        model=args.model,
        device=args.device,
        prefill_tokens=_ints("--prefill", args.prefill),
        decode_batch=_ints("--batches", args.batches),
        decode_context=_ints("--contexts", args.contexts),
        steps=args.steps,
    )
    profile = measure_profile(cfg)
    profile.save(Path(args.out))
    print(json.dumps({"profile": str(args.out), "kv_tokens": profile.kv_tokens}))
    return 0


def _derive(args: argparse.Namespace) -> int:
    from blitzscale.control.costmodel import load_profile

    missing = [_flag(n) for n in _DERIVE_FLAGS if getattr(args, n) is None]
    if missing:
        raise InvalidRequestError(f"--derive needs {', '.join(missing)}")
    for n in ("bandwidth_factor", "flops_factor", "memory_bytes"):
        if not getattr(args, n) > 0:
            raise InvalidRequestError(f"{_flag(n)} must be > 0, got {getattr(args, n)}")
    base = load_profile(args.derive)
    derived = base.derive(
        args.name, args.device_name, args.bandwidth_factor, args.flops_factor, int(args.memory_bytes)
    )
    derived.save(Path(args.out))
    print(json.dumps({"profile": str(args.out), "kv_tokens": derived.kv_tokens}))
    return 0


def _planner_knobs(pairs: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` strings as [planner] values (numbers as TOML reads them), checked by
    PlannerConfig.from_dict, which names an unknown key or a wrong type."""
    import tomllib

    from blitzscale.control.config import PlannerConfig

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidRequestError(f"--planner takes KEY=VALUE, got {pair!r}")
        try:
            out[key.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            raise InvalidRequestError(
                f"--planner {key.strip()}: {value!r} is not a number or boolean"
            ) from None
    try:
        PlannerConfig.from_dict(out)
    except (TypeError, ValueError) as e:
        raise InvalidRequestError(f"--planner: {e}") from e
    return out


def _check(args: argparse.Namespace) -> list[str]:
    from blitzscale.control.live_split import SPLIT_NAMES
    from blitzscale.sim.runner import SIM_POLICIES

    if args.format not in TRACE_FORMATS:
        raise InvalidRequestError(f"--format must be one of {', '.join(TRACE_FORMATS)}, got {args.format!r}")
    if args.live_split not in SPLIT_NAMES:
        raise InvalidRequestError(
            f"--live-split must be one of {', '.join(SPLIT_NAMES)}, got {args.live_split!r}"
        )
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    bad = [p for p in policies if p not in SIM_POLICIES]
    if bad or not policies:
        raise InvalidRequestError(
            f"--policy: unknown {bad or args.policy!r}; known: {', '.join(SIM_POLICIES)}"
        )
    for flag, v in (("--rate-scale", args.rate_scale), ("--time-scale", args.time_scale)):
        if not v > 0:
            raise InvalidRequestError(f"{flag} must be > 0, got {v}")
    for flag, v in (
        ("--duration", args.duration),
        ("--ttft-slo", args.ttft_slo),
        ("--tbt-slo", args.tbt_slo),
        ("--max-input", args.max_input),
        ("--max-output", args.max_output),
    ):
        if v is not None and not v > 0:
            raise InvalidRequestError(f"{flag} must be > 0, got {v}")
    from blitzscale.demo.workload import MAX_MODELS

    if not 1 <= args.models <= MAX_MODELS:
        raise InvalidRequestError(f"--models must be in [1, {MAX_MODELS}], got {args.models}")
    many = {"--keep-alive": args.keep_alive, "--models-per-rank": args.models_per_rank}
    many["--host-memory-gb"] = args.host_memory_gb
    if args.models == 1 and (given := [flag for flag, v in many.items() if v is not None]):
        raise InvalidRequestError(f"{', '.join(given)}: only with --models > 1 (one model here)")
    args.keep_alive = 5.0 if args.keep_alive is None else args.keep_alive
    args.models_per_rank = args.models_per_rank or 0
    args.host_memory_gb = args.host_memory_gb or 0.0
    if args.models_per_rank < 0:
        raise InvalidRequestError(
            f"--models-per-rank must be >= 0 (0: as many as fit), got {args.models_per_rank}"
        )
    if not args.keep_alive >= 0 or not args.host_memory_gb >= 0:
        raise InvalidRequestError(
            f"--keep-alive and --host-memory-gb must be >= 0, got {args.keep_alive} / {args.host_memory_gb}"
        )
    if not Path(args.trace).is_file():
        raise InvalidRequestError(f"--trace: no file {args.trace!r}")
    return policies


def run_simulate(args: argparse.Namespace) -> int:
    policies = _check(args)
    from dataclasses import replace

    from blitzscale.client.traces import load_trace, transform
    from blitzscale.serve.config import SERVE_ENGINE
    from blitzscale.serve.router import RouterConfig
    from blitzscale.sim.compare import run_policies
    from blitzscale.sim.config import load_model, load_preset
    from blitzscale.sim.runner import SimSetup

    preset, model = load_preset(args.preset), load_model(args.model)
    preset.instance_profile(model)  # a missing profile fails here, before any run
    if args.ttft_slo:  # (the planner holds the SLO it is judged by)
        model = replace(model, ttft_slo_s=args.ttft_slo)
    trace = load_trace(args.trace, TRACE_FORMATS[args.format])
    trace = transform(
        trace,
        duration=args.duration,
        time_scale=args.time_scale,
        rate_scale=args.rate_scale,
        max_input=args.max_input or model.max_model_len // 2,
        max_output=args.max_output or model.max_model_len // 2,
    )
    if not trace:
        raise InvalidRequestError("the trace has no request in the chosen window")
    try:  # (a bad share is refused before anything runs)
        PolicyConfig(hot_prefix_share=args.hot_prefix_share)
    except ValueError as e:
        raise InvalidRequestError(f"--hot-prefix-share: {e}") from e
    setup = SimSetup(
        preset=preset,
        model=model,
        mode=args.mode,
        planner_overrides=_planner_knobs(args.planner),
        engine=replace(SERVE_ENGINE, prefix_caching=not args.no_prefix_caching),
        prefix_routing=not args.no_prefix_routing,
        hot_prefix_share=args.hot_prefix_share,
        router=RouterConfig(
            mode=args.mode, max_queue_tokens=0, max_queue_wait_s=0, live_split=args.live_split
        ),
    )
    trace_models = None
    if args.models > 1:
        from blitzscale.demo.workload import interleaved, model_names, model_slices

        names = model_names(args.models)
        trace, trace_models = interleaved(model_slices(trace, names))
        setup = replace(
            setup,
            models=tuple(names),
            keep_alive_s=args.keep_alive,
            host_memory_bytes=int(args.host_memory_gb * 1e9),
            models_per_rank=args.models_per_rank,
        )
    slo = (model.ttft_slo_s, args.tbt_slo or model.tbt_slo_s)
    out = Path(args.out)
    rows = run_policies(
        setup, trace, policies, out, slo, show_progress=not args.quiet, trace_models=trace_models
    )
    (out / "comparison.json").write_text(json.dumps(rows, indent=2) + "\n")
    _print_table(rows)
    return 0


def _print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    per_rank = rows[0]["models_per_rank"] if rows else 1
    t = Table(title="simulated policies" + (f" ({per_rank} models resident per GPU)" if per_rank > 1 else ""))
    cols = (
        "policy",
        "ok/requests",
        "TTFT mean",
        "TTFT p99",
        "TBT p99",
        "SLO",
        "GPU s",
        "ups",
        "disk",
        "tail: queue/load/relay/compute ms",  # (means over the slowest 1%)
        "wall s",
    )
    for col in cols:
        t.add_column(col)

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{1000 * v:.0f} ms"

    for r in rows:
        slo = r["slo_attainment"]
        t.add_row(
            r["policy"],
            f"{r['ok']}/{r['requests']}",
            ms(r["ttft_mean_s"]),
            ms(r["ttft_p99_s"]),
            ms(r["tbt_p99_s"]),
            "-" if slo is None else f"{100 * slo:.0f}%",
            f"{r['gpu_seconds']:.0f}",
            str(r["scale_ups"]),
            str(r["disk_loads"]),
            "/".join(f"{r[f'tail_{k}_ms']:.0f}" for k in ("queue", "load", "relay", "compute")),
            f"{r['sim_wall_s']:.1f}",
        )
    Console().print(t)
