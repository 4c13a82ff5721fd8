"""Solve times of the planned live split (control/live_split.py) against queue length, for
Llama-3-8B's 32 layers and a 72B model's 80, on random problems shaped like a scale-up over
the network (layers landing over 0.3-1.5 s, prompts of 200-3,000 tokens at an H200's prefill
rate, TTFT deadlines 0.1-1.5 s away, the source busy 0-0.6 s). Each queue length: 20
problems after one warm-up solve. Prints JSON: per (layers, tasks) the median, p99 and max
solve time in ms and how many fell back to greedy at the 40 ms limit.

    .venv/bin/python docs/results/live_split_solve_times.py > docs/results/live_split_solve_times.json
"""

from __future__ import annotations

import json
import os
import platform
import random
import statistics

from blitzscale.control.live_split import (
    DEFAULT_TIME_LIMIT_S,
    SplitProblem,
    SplitTask,
    even_arrivals,
    solve_split,
)

PREFILL_TOKENS_PER_S = 16_000  # an 8B prompt on one H200 (the simulator's profile, rounded)


def problem(rng: random.Random, tasks: int, layers: int) -> SplitProblem:
    return SplitProblem(
        tuple(
            SplitTask(
                deadline_s=rng.uniform(0.1, 1.5),
                layer_s=rng.randint(200, 3000) / PREFILL_TOKENS_PER_S / 32,
            )
            for _ in range(tasks)
        ),
        even_arrivals(layers, rng.randint(1, layers // 4), rng.uniform(0.3, 1.5)),
        source_free_s=rng.uniform(0.0, 0.6),
    )


def main() -> None:
    rng = random.Random(0)
    solve_split(problem(rng, 2, 32))  # (the first solve loads the solver)
    rows = []
    for layers in (32, 80):
        for n in (1, 2, 4, 8, 12, 16):
            times, falls = [], 0
            for _ in range(20):
                plan = solve_split(problem(rng, n, layers), DEFAULT_TIME_LIMIT_S)
                times.append(1000 * plan.solve_s)
                falls += plan.fell_back
            times.sort()
            rows.append(
                {
                    "layers": layers,
                    "tasks": n,
                    "median_ms": round(statistics.median(times), 2),
                    "p99_ms": round(times[-1 if len(times) < 100 else int(0.99 * len(times))], 2),
                    "max_ms": round(times[-1], 2),
                    "fallbacks": falls,
                    "problems": len(times),
                }
            )
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    print(json.dumps({"machine": machine, "limit_ms": 1000 * DEFAULT_TIME_LIMIT_S, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
