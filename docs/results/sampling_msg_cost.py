"""What building a request's sampling message costs (`blitzscale.messages.sampling_msg`,
made at every dispatch and relay), against the `dataclasses.asdict` it used before (a deep
copy of every field), per call on one core; and how many calls one simulation makes (the
3-model `simulate` of tests/sim/test_models_sim.py, under cProfile) with its whole CPU.

Run (repo root): `.venv/bin/python docs/results/sampling_msg_cost.py`. Prints JSON.
"""

from __future__ import annotations

import cProfile
import dataclasses
import json
import pstats
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    from blitzscale.cli.main import main as cli
    from blitzscale.core.sampling import SamplingParams
    from blitzscale.messages import GrammarMsg, SamplingMsg, sampling_msg

    params = SamplingParams(max_tokens=16, temperature=0.7, seed=3, logit_bias=((28, -100.0),), logprobs=2)

    def with_asdict() -> SamplingMsg:
        fields = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(params).items()}
        g = params.grammar
        fields["grammar"] = None if g is None else GrammarMsg(g.kind, g.schema)
        return SamplingMsg(**fields)

    assert with_asdict() == sampling_msg(params)
    n = 20_000
    now_us = min(timeit.repeat(lambda: sampling_msg(params), number=n, repeat=3)) / n * 1e6
    before_us = min(timeit.repeat(with_asdict, number=n, repeat=3)) / n * 1e6
    out = Path("/tmp/sampling_msg_cost_sim")
    trace = str(ROOT / "blitzscale/data/azure_code_2023_slice.csv")
    argv = ["simulate", "--trace", trace, "--duration", "60", "--policy", "blitz,sllm", "--quiet",
            "--models", "3", "--keep-alive", "5", "--host-memory-gb", "48.2", "--out", str(out),
            "--models-per-rank", "1"]  # fmt: skip
    prof = cProfile.Profile()
    prof.runcall(cli, argv)
    stats = pstats.Stats(prof)
    calls = next((v[1] for k, v in stats.stats.items() if k[2] == "sampling_msg"), 0)  # type: ignore[attr-defined]
    print(json.dumps({
        "sampling_msg_us": round(now_us, 2),
        "with_asdict_us": round(before_us, 2),
        "calls_in_the_simulation": calls,
        "simulation_cpu_s_under_cprofile": round(stats.total_tt, 1),  # type: ignore[attr-defined]
        "saved_cpu_s_in_the_simulation": round(calls * (before_us - now_us) / 1e6, 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
