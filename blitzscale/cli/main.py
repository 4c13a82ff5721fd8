"""Entry point: `blitzscale SUBCOMMAND ...`. Errors users caused print one line, exit 2 (so
does a file or folder the command cannot read or write: its path and why)."""

from __future__ import annotations

import argparse
import sys

from blitzscale.cli import batch, convert, demo, generate, serve, simulate, tokenizer
from blitzscale.cli.common import check_out, quiet_libraries
from blitzscale.errors import BlitzScaleError

OUT_IS_A_FILE = frozenset({"bench", "profile"})  # their --out is a JSON file; the others' a folder


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blitzscale", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (generate, convert, tokenizer, serve, demo, batch, simulate):
        module.add_parser(sub)
    from blitzscale.bench import cli as bench_cli
    from blitzscale.client.cli import add_replay_parser, run_replay

    bench_cli.add_parser(sub)
    add_replay_parser(sub).set_defaults(func=run_replay)
    return parser


def main(argv: list[str] | None = None) -> int:
    quiet_libraries()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "out", None) is not None:
            check_out(args.out, is_file=args.command in OUT_IS_A_FILE)
        return int(args.func(args) or 0)
    except BlitzScaleError as e:
        print(f"blitzscale {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.filename is None:  # (not a path the user gave: a bug or the machine's, keep the traceback)
            raise
        print(f"blitzscale {args.command}: error: {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
