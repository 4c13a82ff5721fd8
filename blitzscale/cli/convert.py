"""`blitzscale convert SRC DST`."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="write a model in our per-rank contiguous format")
    p.add_argument("src", help="model name or path (GGUF file, HF folder, blitzscale folder)")
    p.add_argument("dst", type=Path, help="output folder")
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=None,
        help="stored precision (default: the source's)",
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks to shard for")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from blitzscale.checkpoint.convert import convert
    from blitzscale.checkpoint.native import parse_dtype

    dtype = parse_dtype(args.dtype) if args.dtype else None
    dst = convert(args.src, args.dst, dtype=dtype, tp_size=args.tp)
    print(f"wrote {dst}")
    return 0
