"""`blitzscale bench fidelity --calibrate` beside busy loops (session 30): N processes of
`while True: pass`, started in our session or each in a session of its own, for the whole
run, to see how the live workers and the simulated cores are slowed by them (the cores
are shared by session first where the kernel has `sched_autogroup`; docs/benchmarks.md,
"Fidelity", session 30).

Run (repo root, a quiet 2-core machine): `.venv/bin/python docs/results/fidelity_beside_loops.py
N same|new > OUT.json`.
"""

from __future__ import annotations

import json
import subprocess
import sys

from blitzscale.bench.fidelity import FidelityConfig, run_fidelity


def main() -> None:
    n, session = int(sys.argv[1]), sys.argv[2] == "new"
    busy = "while True: pass"
    procs = [subprocess.Popen([sys.executable, "-c", busy], start_new_session=session) for _ in range(n)]
    try:
        res = run_fidelity(FidelityConfig(calibrate=True))
    finally:
        for p in procs:
            p.kill()
    res["busy"] = {"loops": n, "new_session": session}
    print(json.dumps(res))


if __name__ == "__main__":  # (the workers' forkserver imports this file again)
    main()
