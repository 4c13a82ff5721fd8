"""`blitzscale bench ...`."""

from __future__ import annotations

import argparse
import json


def _int_list(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from e


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks (print JSON)")
    bsub = p.add_subparsers(dest="bench", required=True)
    e = bsub.add_parser("engine", help="decode / prefill speed and correctness against transformers")
    e.add_argument("--model", default="random:llama3-8b")
    e.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    e.add_argument("--batch-sizes", type=_int_list, default=[1, 8, 32])
    e.add_argument("--prompt-len", type=int, default=128)
    e.add_argument("--decode-steps", type=int, default=32)
    e.add_argument("--prefill-len", type=int, default=2048)
    e.add_argument("--no-hf", action="store_true", help="skip the transformers reference")
    e.add_argument("--json", action="store_true", help="(output is always JSON)")
    e.set_defaults(func=_run_engine)


def _run_engine(args: argparse.Namespace) -> int:
    from blitzscale.bench.engine_bench import EngineBenchConfig, run_engine_bench
    from blitzscale.cli.common import check_device

    check_device(args.device)
    cfg = EngineBenchConfig(
        model=args.model,
        device=args.device,
        batch_sizes=tuple(args.batch_sizes),
        prompt_len=args.prompt_len,
        decode_steps=args.decode_steps,
        prefill_len=args.prefill_len,
        with_hf=not args.no_hf,
    )
    print(json.dumps(run_engine_bench(cfg), indent=2))
    return 0
