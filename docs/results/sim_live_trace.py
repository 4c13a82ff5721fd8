"""A simulation (the `blitzscale simulate ...` or `blitzscale batch ... --simulate ...`
command after `--`, without `blitzscale`) with the router's live scaling decisions printed
between two moments of each run's virtual clock:

- `route`: each prompt of at least MIN_TOKENS tokens: its options (rank, room or full,
  tokens outstanding, seconds until a live target's last layer lands, its partner's
  pipeline) with `control/routing.py`'s finish estimate, and the rank chosen;
- `relay`: each round of `serve/live.py`: per live target, its partner, whether the partner
  has prompts of its own, and the prompts queued on the target;
- `ask`: each relay the round asks a target for (its head pulled by the partner, or moved to
  another instance by `_rescue`), with the head's request id and tokens.

    .venv/bin/python docs/results/sim_live_trace.py --from 94.9 --to 96.6 --min-tokens 2000 -- \\
        simulate --preset paper-b --model llama3-8b --trace /tmp/win.csv --format azure --policy blitz \\
        --max-input 8000 --max-output 8000 --out /tmp/win_trace --quiet

(the window from docs/results/azure_window.py; docs/benchmarks.md, "The whole Azure code
trace, as recorded", quotes what it printed). Times are the virtual clock's, which starts
before the trace's first request (the cluster's first load).
"""

from __future__ import annotations

import argparse
import sys

from blitzscale import clock
from blitzscale.cli.main import main as blitzscale_main
from blitzscale.control import routing
from blitzscale.messages import RelayMsg
from blitzscale.serve import live, placement


def _route(lo: float, hi: float, min_tokens: int) -> None:
    choose = placement.finish_first

    def traced(options, tokens, rate):  # type: ignore[no-untyped-def]
        rank = choose(options, tokens, rate)
        if tokens >= min_tokens and lo <= clock.now() <= hi:
            cells = [
                f"{o.rank}:{'room' if o.has_room else 'full'} out={o.outstanding_tokens} "
                f"cached={o.cached_tokens} load={o.loaded_in_s:.3f} pipe={o.pipeline_tokens} "
                f"finish={routing.finish_s(o, tokens, rate):.3f}"
                for o in options
            ]
            print(f"route t={clock.now():.3f} tokens={tokens} -> {rank}: " + "; ".join(cells))
        return rank

    placement.finish_first = traced


def _relays(lo: float, hi: float) -> None:
    rounds = live.LiveScaling.round

    async def traced(self):  # type: ignore[no-untyped-def]
        rt = self.router
        if not lo <= clock.now() <= hi:
            return await rounds(self)
        for target, source in self.pairs.items():
            src = self.state.get(source) if source is not None else None
            queued = [len(r.prompt) for r in rt.prefilling_on(target)]
            print(
                f"relay t={clock.now():.3f} target={target} partner={source} "
                f"partner_tokens={getattr(src, 'outstanding_tokens', None)} queued={queued}"
            )
        send = rt.data.send

        async def asked(rank, msg):  # type: ignore[no-untyped-def]
            if isinstance(msg, RelayMsg):  # a pull by the partner, or a move elsewhere
                head = [(r.id, len(r.prompt)) for r in rt.prefilling_on(rank)[:1]]
                print(f"ask t={clock.now():.3f} target={rank} -> rank {msg.dst_rank}: head={head}")
            await send(rank, msg)

        rt.data.send = asked
        try:
            await rounds(self)
        finally:
            rt.data.send = send

    live.LiveScaling.round = traced


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="lo", type=float, default=0.0)
    p.add_argument("--to", dest="hi", type=float, default=float("inf"))
    p.add_argument("--min-tokens", type=int, default=0)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then simulate ... or batch ...")
    args = p.parse_args()
    _route(args.lo, args.hi, args.min_tokens)
    _relays(args.lo, args.hi)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    sys.argv = ["blitzscale", *command]
    sys.exit(blitzscale_main())
