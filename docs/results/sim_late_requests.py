"""Where the requests over their TTFT SLO were sent, in one simulated run: the state of the
instance each prompt was dispatched to (a loading live target is `new_prefill`, its
partner `old_prefill`), recorded by wrapping the router's send, and when the late ones
arrived (by second of the trace). The figures behind benchmarks.md's "Routing by when a
prompt finishes" (the late requests sent to loading targets on 24B before the change;
the 8B pd burst at 11-13 s), with the run's scale events.

Run (repo root): `.venv/bin/python docs/results/sim_late_requests.py [--preset paper-a]
[--model mistral-24b] [--mode pd] [--policy blitz] [--trace FILE --format FMT]`. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="paper-a")
    p.add_argument("--model", default="mistral-24b")
    p.add_argument("--mode", default="pd", choices=["pd", "colocated"])
    p.add_argument("--policy", default="blitz")
    p.add_argument("--trace", default="blitzscale/data/azure_code_2023_slice.csv")
    p.add_argument("--format", default="azure")
    args = p.parse_args()

    from blitzscale.client.traces import load_trace, transform
    from blitzscale.messages import GenerateMsg
    from blitzscale.serve import router as routing
    from blitzscale.serve.config import SERVE_ENGINE
    from blitzscale.sim.config import load_model, load_preset
    from blitzscale.sim.runner import SimSetup, simulate

    sent_to: dict[str, str] = {}  # request -> the state of the instance it first went to
    send = routing.Router._send

    async def recording(self: routing.Router, rank: int, msg: object) -> None:
        if isinstance(msg, GenerateMsg):
            sent_to.setdefault(msg.request_id.split("#")[0], self.instances[rank].state.value)
        await send(self, rank, msg)  # type: ignore[arg-type]

    routing.Router._send = recording  # type: ignore[method-assign]
    preset, model = load_preset(args.preset), load_model(args.model)
    trace = transform(
        load_trace(args.trace, args.format),
        max_input=model.max_model_len // 2,
        max_output=model.max_model_len // 2,
    )
    setup = SimSetup(preset=preset, model=model, mode=args.mode, engine=SERVE_ENGINE)
    res = simulate(setup, trace, args.policy)
    late = [r for r in res.records if r.ttft_s is not None and r.ttft_s > model.ttft_slo_s]
    print(
        json.dumps(
            {
                "preset": args.preset,
                "model": args.model,
                "mode": args.mode,
                "policy": args.policy,
                "ttft_slo_s": model.ttft_slo_s,
                "requests": len(res.records),
                "sent_to": dict(Counter(sent_to.values())),
                "late": len(late),
                "late_sent_to": dict(Counter(sent_to.get(f"sim-{r.index}", "?") for r in late)),
                "late_by_arrival_s": dict(sorted(Counter(int(r.scheduled_s) for r in late).items())),
                "scale_events": [  # (seconds from the trace's start, up/down, path, ranks)
                    (round(e.time, 2), e.direction, e.path, list(e.ranks)) for e in res.events
                ],
            }
        )
    )


if __name__ == "__main__":
    main()
