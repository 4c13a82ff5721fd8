"""`blitzscale tokenizer NAME DIR`: a model's tokenizer as a Hugging Face folder, no weights.

What clients that count tokens themselves need (guidellm's `--processor`, vLLM's bench):
`tokenizer.json`, `tokenizer_config.json` (with the chat template) and the special tokens,
a few MB, where `blitzscale convert` would also write every weight. The folder loads with
transformers 4.x as with 5.x (`checkpoint.loader.save_tokenizer`).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokenizer", help="write a model's tokenizer as a Hugging Face folder (no weights)")
    p.add_argument("model", help="model name or path (GGUF file, HF folder, blitzscale folder)")
    p.add_argument("dst", type=Path, help="output folder (created if missing)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from blitzscale.checkpoint import load_tokenizer, resolve_model
    from blitzscale.checkpoint.loader import save_tokenizer
    from blitzscale.errors import InvalidRequestError

    tokenizer = load_tokenizer(resolve_model(args.model))
    if tokenizer is None:
        raise InvalidRequestError(
            f"{args.model!r} has no tokenizer (random weights, or a folder without one)"
        )
    if args.dst.exists() and not args.dst.is_dir():
        raise InvalidRequestError(f"{args.dst} exists and is not a folder")
    args.dst.mkdir(parents=True, exist_ok=True)
    files = save_tokenizer(tokenizer, args.dst)
    size = sum(Path(f).stat().st_size for f in files if Path(f).is_file())
    print(f"wrote the tokenizer of {args.model} to {args.dst} ({len(files)} files, {size / 1e6:.1f} MB)")
    return 0
