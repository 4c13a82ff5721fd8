"""`blitzscale bench ...`."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from blitzscale.control.config import POLICY_NAMES


def _int_list(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from e


def _policy_arg(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument(
        "--policy", default=default, help=f"scaling policy: {', '.join(POLICY_NAMES)} (default {default})"
    )


def _mode_and_policy(p: argparse.ArgumentParser, policy: str) -> None:
    p.add_argument(
        "--mode",
        choices=["pd", "colocated"],
        default="pd",
        help="prefill and decode on separate instances (pd) or together (colocated; default pd)",
    )
    _policy_arg(p, policy)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks (print JSON)")
    bsub = p.add_subparsers(dest="bench", required=True)
    e = bsub.add_parser("engine", help="decode / prefill speed and correctness against transformers")
    e.add_argument("--model", default="random:llama3-8b", help="model name or path (default %(default)s)")
    e.add_argument("--device", choices=["cpu", "cuda"], default="cuda", help="where to run (default cuda)")
    e.add_argument(
        "--batch-sizes", type=_int_list, default=[1, 8, 32, 64], help="decode batch sizes (1,8,32,64)"
    )
    e.add_argument("--context-lens", type=_int_list, default=[512, 2048], help="decode contexts")
    e.add_argument("--decode-steps", type=int, default=32, help="decode steps timed a cell (default 32)")
    e.add_argument("--prefill-len", type=int, default=2048, help="prompt tokens of the timed prefill")
    e.add_argument("--block-size", type=int, default=64, help="tokens per KV block (serve's default is 16)")
    e.add_argument("--no-hf", action="store_true", help="skip the transformers reference")
    e.add_argument(
        "--dtype",
        choices=["bf16", "fp8"],
        default="bf16",
        help="fp8: the model with FP8 linears beside the bf16 model of the same weights (both timed, "
        "ratios printed)",
    )
    e.add_argument("--json", action="store_true", help="(output is always JSON)")
    e.set_defaults(func=_run_engine)

    s = bsub.add_parser("serve", help="serve's default configuration against its engine alone, same mixes")
    s.add_argument("--model", default="", help="default: random:llama3-8b on cuda, smollm2-135m on cpu")
    s.add_argument("--device", choices=["cpu", "cuda"], default="cuda", help="where to run (default cuda)")
    s.add_argument("--streams", type=_int_list, default=None, help="closed-loop streams (default 64,256)")
    s.add_argument("--prompt-len", type=int, default=0, help="closed-loop prompt tokens (default 512)")
    s.add_argument("--max-tokens", type=int, default=0, help="closed-loop output tokens (default 256)")
    s.add_argument("--window", type=float, default=0.0, help="measured seconds of each closed loop")
    s.add_argument("--warmup", type=float, default=-1.0, help="unmeasured seconds before it")
    s.add_argument("--burst", type=int, default=0, help="prompts sent at once (default 128)")
    s.add_argument("--burst-len", type=int, default=0, help="their tokens (default 2048)")
    s.add_argument("--single-len", type=int, default=0, help="one prompt at a time: its tokens")
    s.add_argument("--no-engine", action="store_true", help="skip the engine-alone half")
    s.add_argument(
        "--simulate",
        type=Path,
        default=None,
        help="a live run's JSON: its mixes on the simulator with its cost model, side by side",
    )
    s.add_argument("--profile", default="", help="with --simulate: this cost model instead (name or .json)")
    s.add_argument("--out", type=Path, default=None, help="also write the JSON to this file")
    s.set_defaults(func=_run_serve)

    t = bsub.add_parser("transfer", help="weight loading by network, host cache and disk paths")
    t.add_argument("--model", default="smollm2-135m", help="model name or path (default %(default)s)")
    t.add_argument("--workers", type=int, default=2, help="worker processes (a source and targets)")
    t.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to run (default cpu)")
    t.add_argument("--mode", default="chain", help="p2p|chain|striped|host|disk|hf, comma-separated, or all")
    t.add_argument("--piece-bytes", type=int, default=0, help="split stripes into pieces (0: per segment)")
    t.add_argument("--readers", type=int, default=8, help="parallel disk readers")
    t.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "blitzscale-bench",
        help="where the disk path's converted checkpoint is written (default %(default)s)",
    )
    t.add_argument("--limits", action="store_true", help="also measure raw NCCL / host copy / disk limits")
    t.add_argument(
        "--dtype",
        choices=["dense", "fp8"],
        default="dense",
        help="fp8: every path for a random:NAME model and for NAME:fp8 in one run, with their ratios",
    )
    t.add_argument("--json", action="store_true", help="(output is always JSON)")
    t.set_defaults(func=_run_transfer)

    v = bsub.add_parser("live", help="TTFT of a burst arriving at a scale decision, per load path")
    v.add_argument("--model", default="", help="default: random:llama3-8b on cuda, smollm2-135m on cpu")
    v.add_argument("--device", choices=["cpu", "cuda"], default="cuda", help="where to run (default cuda)")
    v.add_argument("--paths", default="all", help="live,network,host,disk,none (comma-separated) or all")
    v.add_argument("--requests", type=int, default=64, help="prompts in the burst (default 64)")
    v.add_argument("--prompt-len", type=int, default=1024, help="tokens of each prompt (default 1024)")
    v.add_argument("--max-tokens", type=int, default=4, help="tokens each request generates (default 4)")
    v.add_argument("--transfer-rate", type=float, default=0.0, help="cap network transfers, bytes/s")
    v.add_argument("--disk-rate", type=float, default=0.0, help="cap disk reads, bytes/s")
    v.add_argument("--kv-blocks", type=int, default=0, help="KV blocks per instance (0: from memory)")
    v.add_argument("--cache-dir", default="", help="where the converted model is kept")
    v.set_defaults(func=_run_live)

    b = bsub.add_parser("standby", help="cost of starting an instance's engine, with and without a standby")
    b.add_argument("--model", default="random:llama3-8b", help="model name or path (default %(default)s)")
    b.add_argument("--device", choices=["cpu", "cuda"], default="cuda", help="where to run (default cuda)")
    b.add_argument("--runs", default="off,on,off", help="standby settings, one fresh worker each")
    b.add_argument("--out", type=Path, default=None, help="also write the JSON to this file")
    b.set_defaults(func=_run_standby)

    f = bsub.add_parser("fidelity", help="one small configuration live on CPU workers and simulated")
    f.add_argument("--workers", type=int, default=2, help="CPU workers of the live run (default 2)")
    _policy_arg(f, "blitz-nolive")
    f.add_argument("--rate-scale", type=float, default=0.05, help="share of the shipped slice's requests")
    f.add_argument("--duration", type=float, default=90.0, help="seconds of the slice replayed")
    f.add_argument("--sim-only", action="store_true", help="skip the live run")
    f.add_argument(
        "--calibrate", action="store_true", help="the simulated cores carry the other work measured live"
    )
    f.add_argument("--out", type=Path, default=None, help="also write the JSON to this file")
    f.set_defaults(func=_run_fidelity)

    k = bsub.add_parser("soak", help="open-loop load above capacity with worker kills; answers checked")
    k.add_argument("--minutes", type=float, default=30.0, help="length of the open-loop load (default 30)")
    k.add_argument("--rate-x", type=float, default=2.0, help="offered load in multiples of capacity")
    k.add_argument("--workers", type=int, default=4, help="CPU workers (default 4)")
    _mode_and_policy(k, "blitz")
    k.add_argument("--kills", type=int, default=2, help="workers killed during the run")
    k.add_argument("--max-tokens", type=int, default=16, help="tokens each request generates (default 16)")
    k.add_argument("--seed", type=int, default=0, help="seed of the arrivals, prompts and kills")
    k.add_argument("--out", type=Path, default=None, help="also write the JSON to this file")
    k.set_defaults(func=_run_soak)

    r = bsub.add_parser("runs", help="finished runs (their requests.jsonl) side by side, one pair of SLOs")
    r.add_argument("dirs", nargs="+", type=Path, metavar="RUN_DIR")
    r.add_argument("--slo-ttft-ms", type=float, required=True, help="time-to-first-token SLO, ms")
    r.add_argument("--slo-tbt-ms", type=float, required=True, help="time-between-tokens SLO, ms")
    r.add_argument("--out", type=Path, default=None, help="also write the JSON to this file")
    r.set_defaults(func=_run_runs)

    d = bsub.add_parser("steady", help="closed-loop steady load: scale-ups and releases once settled")
    d.add_argument("--streams", type=int, default=16, help="closed-loop clients (default 16)")
    d.add_argument("--seconds", type=float, default=60.0, help="length of the load (default 60)")
    d.add_argument("--settle", type=float, default=10.0, help="events before this are not counted")
    d.add_argument("--workers", type=int, default=4, help="CPU workers (default 4)")
    _mode_and_policy(d, "blitz")
    d.add_argument("--max-tokens", type=int, default=32, help="tokens each streamed completion generates")
    d.add_argument("--prompt-words", type=int, default=0, help="pad each prompt to about this many words")
    d.add_argument("--reload-cost-factor", type=float, default=None, help="override [planner] (0: old rule)")
    d.add_argument("--out", type=Path, default=None, help="also write the JSON to this file")
    d.set_defaults(func=_run_steady)


def _run_runs(args: argparse.Namespace) -> int:
    from blitzscale.bench.runs import compare_runs

    _check_flags(
        "fixed",
        ("--slo-ttft-ms", args.slo_ttft_ms, args.slo_ttft_ms > 0, "> 0"),
        ("--slo-tbt-ms", args.slo_tbt_ms, args.slo_tbt_ms > 0, "> 0"),
    )
    _emit(compare_runs(args.dirs, args.slo_ttft_ms / 1000, args.slo_tbt_ms / 1000), args.out)
    return 0


def _run_standby(args: argparse.Namespace) -> int:
    from blitzscale.bench.standby_bench import StandbyBenchConfig, run_standby_bench
    from blitzscale.errors import InvalidRequestError

    runs = tuple(r for r in args.runs.split(",") if r)
    bad = [r for r in runs if r not in ("on", "off")]
    if bad or not runs:
        raise InvalidRequestError(f"--runs: expected on/off settings, got {args.runs!r}")
    _check_before_workers(args.device, args.model)
    _emit(run_standby_bench(StandbyBenchConfig(model=args.model, device=args.device, runs=runs)), args.out)
    return 0


def _run_fidelity(args: argparse.Namespace) -> int:
    from blitzscale.bench.fidelity import FidelityConfig, calibrated, requests, run_fidelity, run_sim

    _check_flags(
        args.policy.removesuffix("-peak").removesuffix("-half"),
        ("--workers", args.workers, args.workers >= 2, ">= 2"),
        ("--rate-scale", args.rate_scale, args.rate_scale > 0, "> 0"),
        ("--duration", args.duration, args.duration > 0, "> 0"),
    )
    cfg = FidelityConfig(
        workers=args.workers,
        policy=args.policy,
        rate_scale=args.rate_scale,
        duration_s=args.duration,
        calibrate=args.calibrate,
    )
    if args.sim_only:  # (calibrated: the profile at this machine's speed, no other work)
        cfg, speed = calibrated(cfg)
        result = {"sim": run_sim(cfg, requests(cfg), 0.0, speed)}
    else:
        result = run_fidelity(cfg)
    _emit(result, args.out)
    return 0


def _run_steady(args: argparse.Namespace) -> int:
    from blitzscale.bench.steady import SteadyConfig, run_steady

    _check_flags(
        args.policy,
        ("--streams", args.streams, args.streams >= 1, ">= 1"),
        ("--seconds", args.seconds, args.seconds > 0, "> 0"),
        ("--settle", args.settle, args.settle >= 0, ">= 0"),
        ("--workers", args.workers, args.workers >= 2, ">= 2"),
        ("--max-tokens", args.max_tokens, args.max_tokens >= 1, ">= 1"),
        ("--prompt-words", args.prompt_words, args.prompt_words >= 0, ">= 0"),
        ("--reload-cost-factor", args.reload_cost_factor, (args.reload_cost_factor or 0) >= 0, ">= 0"),
    )
    cfg = SteadyConfig(
        streams=args.streams,
        seconds=args.seconds,
        settle_s=args.settle,
        workers=args.workers,
        mode=args.mode,
        policy=args.policy,
        max_tokens=args.max_tokens,
        prompt_words=args.prompt_words,
        reload_cost_factor=args.reload_cost_factor,
    )
    _emit(run_steady(cfg), args.out)
    return 0


def _check_flags(policy: str, *checks: tuple[str, object, bool, str]) -> None:
    """Refuse, naming it, an unknown policy or a flag whose check is false (and the rule it
    broke: "> 0")."""
    from blitzscale.control.config import POLICY_NAMES
    from blitzscale.errors import InvalidRequestError

    if policy not in POLICY_NAMES:
        raise InvalidRequestError(f"--policy: unknown policy {policy!r}; use {', '.join(POLICY_NAMES)}")
    for flag, value, ok, rule in checks:
        if not ok:
            raise InvalidRequestError(f"{flag}: {value} is out of range: it must be {rule}")


def _emit(result: dict, out: Path | None) -> None:
    """Print the JSON, and write it to `out` too when given."""
    text = json.dumps(result, indent=2)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    print(text)


def _run_soak(args: argparse.Namespace) -> int:
    from blitzscale.bench.soak import SoakConfig, run_soak

    _check_flags(
        args.policy,
        ("--minutes", args.minutes, args.minutes > 0, "> 0"),
        ("--rate-x", args.rate_x, args.rate_x > 0, "> 0"),
        ("--workers", args.workers, args.workers >= 2, ">= 2"),
        ("--kills", args.kills, args.kills >= 0, ">= 0"),
        ("--max-tokens", args.max_tokens, args.max_tokens >= 1, ">= 1"),
    )
    cfg = SoakConfig(
        minutes=args.minutes,
        rate_x=args.rate_x,
        workers=args.workers,
        mode=args.mode,
        policy=args.policy,
        kills=args.kills,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )
    _emit(run_soak(cfg), args.out)
    return 0


def _run_transfer(args: argparse.Namespace) -> int:
    from blitzscale.bench.transfer_bench import MODES, TransferBenchConfig, run_transfer_bench
    from blitzscale.cli.common import check_device
    from blitzscale.errors import InvalidRequestError

    check_device(args.device)
    modes = MODES if args.mode == "all" else tuple(m for m in args.mode.split(",") if m)
    if args.dtype == "fp8" and args.mode == "all":  # (the model and modes are checked
        from blitzscale.bench.transfer_bench import FP8_MODES  # before any worker starts)

        modes = FP8_MODES
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise InvalidRequestError(f"--mode: unknown mode {bad or args.mode!r}; use {', '.join(MODES)} or all")
    if args.workers < 1:
        raise InvalidRequestError(f"--workers must be >= 1, got {args.workers}")
    if args.readers < 1 or args.piece_bytes < 0:
        raise InvalidRequestError(
            f"--readers must be >= 1 and --piece-bytes >= 0 (0: a piece per segment), "
            f"got {args.readers} and {args.piece_bytes}"
        )
    _check_before_workers(args.device, args.model)
    cfg = TransferBenchConfig(
        model=args.model,
        workers=args.workers,
        device=args.device,
        modes=modes,
        workdir=args.workdir,
        piece_bytes=args.piece_bytes,
        readers=args.readers,
        limits=args.limits,
        dtype=args.dtype,
    )
    result = run_transfer_bench(cfg)
    print(json.dumps(result, indent=2))
    runs = [result[k] for k in ("dense", "fp8") if k in result] or [result]  # (--dtype fp8: both)
    failed = sorted({m for run in runs for m in modes if "error" in (run.get(m) or {})})
    if failed:
        print(f"blitzscale bench transfer: {', '.join(failed)} failed (see their error)", file=sys.stderr)
    return 1 if failed else 0


def _check_before_workers(device: str, model: str) -> None:
    """The device exists and the model resolves, before a worker is spawned for either."""
    from blitzscale.checkpoint import resolve_model
    from blitzscale.cli.common import check_device

    check_device(device)
    resolve_model(model)


def _run_live(args: argparse.Namespace) -> int:
    from blitzscale.bench.live_bench import PATHS, LiveBenchConfig, run_live_bench
    from blitzscale.cli.common import check_device
    from blitzscale.errors import InvalidRequestError

    check_device(args.device)
    paths = PATHS if args.paths == "all" else tuple(p for p in args.paths.split(",") if p)
    bad = [p for p in paths if p not in PATHS]
    if bad or not paths:
        raise InvalidRequestError(
            f"--paths: unknown path {bad or args.paths!r}; use {', '.join(PATHS)} or all"
        )
    for name, least in (("requests", 1), ("prompt_len", 1), ("max_tokens", 1), ("kv_blocks", 0)):
        if getattr(args, name) < least:
            flag = f"--{name.replace('_', '-')}"
            raise InvalidRequestError(f"{flag} must be >= {least}, got {getattr(args, name)}")
    for flag, value in (("--transfer-rate", args.transfer_rate), ("--disk-rate", args.disk_rate)):
        if value < 0:
            raise InvalidRequestError(f"{flag} must be >= 0 (0: no cap), got {value}")
    model = args.model or ("random:llama3-8b" if args.device == "cuda" else "smollm2-135m")
    cfg = LiveBenchConfig(
        model=model,
        device=args.device,
        paths=paths,
        requests=args.requests,
        prompt_len=args.prompt_len,
        max_tokens=args.max_tokens,
        transfer_bytes_per_s=args.transfer_rate,
        disk_bytes_per_s=args.disk_rate,
        num_kv_blocks=args.kv_blocks,
        cache_dir=args.cache_dir,
    )
    print(json.dumps(run_live_bench(cfg), indent=2))
    return 0


# bench serve's mixes on a CPU worker with SmolLM2 (its steps take a thousand times longer)
CPU_MIX = {
    "streams": (4, 16),
    "prompt_len": 64,
    "max_tokens": 32,
    "window_s": 30.0,
    "warmup_s": 5.0,
    "burst": 16,
    "burst_len": 128,
    "single_len": 256,
    "stream_tokens": 32,
}


def _simulate_serve(args: argparse.Namespace) -> int:
    import json

    from blitzscale.bench.serve_sim import against_live
    from blitzscale.control.costmodel import load_profile
    from blitzscale.errors import InvalidRequestError

    try:
        live = json.loads(args.simulate.read_text())
    except (OSError, ValueError) as e:
        raise InvalidRequestError(f"--simulate {args.simulate}: cannot read it ({e})") from e
    profile = load_profile(args.profile) if args.profile else None
    _emit(against_live(live, profile), args.out)
    return 0


def _run_serve(args: argparse.Namespace) -> int:
    import dataclasses

    from blitzscale.bench.mixes import Mix
    from blitzscale.bench.serve_bench import ServeBenchConfig, run_serve_bench
    from blitzscale.cli.common import check_device
    from blitzscale.errors import InvalidRequestError

    if args.simulate is not None:
        return _simulate_serve(args)
    check_device(args.device)
    cpu = args.device == "cpu"
    base = Mix(**CPU_MIX) if cpu else Mix()  # type: ignore[arg-type]
    flags = {
        "streams": tuple(args.streams) if args.streams else None,
        "prompt_len": args.prompt_len or None,
        "max_tokens": args.max_tokens or None,
        "window_s": args.window or None,
        "warmup_s": args.warmup if args.warmup >= 0 else None,
        "burst": args.burst or None,
        "burst_len": args.burst_len or None,
        "single_len": args.single_len or None,
    }
    try:
        mix = dataclasses.replace(base, **{k: v for k, v in flags.items() if v is not None})
    except ValueError as e:
        raise InvalidRequestError(f"bench serve: {e}") from e
    model = args.model or ("smollm2-135m" if cpu else "random:llama3-8b")
    cfg = ServeBenchConfig(model=model, device=args.device, mix=mix, engine_alone=not args.no_engine)
    _emit(run_serve_bench(cfg), args.out)
    return 0


def _run_engine(args: argparse.Namespace) -> int:
    from blitzscale.bench.engine_bench import EngineBenchConfig, run_engine_bench
    from blitzscale.cli.common import check_device

    check_device(args.device)
    if args.block_size < 1:
        from blitzscale.errors import InvalidRequestError

        raise InvalidRequestError(f"--block-size: {args.block_size} is out of range: it must be >= 1")
    cfg = EngineBenchConfig(
        model=args.model,
        device=args.device,
        batch_sizes=tuple(args.batch_sizes),
        context_lens=tuple(args.context_lens),
        decode_steps=args.decode_steps,
        prefill_len=args.prefill_len,
        block_size=args.block_size,
        with_hf=not args.no_hf,
        dtype=args.dtype,
    )
    print(json.dumps(run_engine_bench(cfg), indent=2))
    return 0
