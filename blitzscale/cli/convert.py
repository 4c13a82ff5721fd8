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
        choices=["float32", "bfloat16", "float16", "fp8"],
        default=None,
        help="stored precision (default: the source's, an FP8 checkpoint stays FP8); fp8: e4m3 "
        "linear weights with per-channel scales, the rest bfloat16; a float dtype: every weight in "
        "it (an FP8 source dequantized)",
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks to shard for")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging

    from blitzscale.checkpoint.convert import convert, parse_target
    from blitzscale.core.progress import Phase

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")  # (the progress lines)
    dtype, quant = parse_target(args.dtype)
    with Phase(f"converting {args.src}") as phase:
        dst = convert(args.src, args.dst, dtype=dtype, tp_size=args.tp, quant=quant, report=phase.report)
    print(f"wrote {dst}")
    return 0
