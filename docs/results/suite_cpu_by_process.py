"""Scratch measurement (issue 27): where a test run's CPU goes, by kind of process. Samples
every process's CPU (utime + stime from /proc/PID/stat) every 2 s until killed, and keeps
writing the totals by kind to the JSON file given: our workers (forked from the
forkserver), the xdist workers, Ray's processes, the top pytest, CLI subprocesses, others.
A process that lives less than one sample is missed. Run beside a suite, e.g.
`python3 docs/results/suite_cpu_by_process.py /tmp/cpu_by_process.json & make test; kill %1`."""

import collections
import json
import os
import sys
import time

TCK = os.sysconf("SC_CLK_TCK")


def cmdline(pid: str) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace")


def kind(pid: str) -> str:
    try:
        cmd = cmdline(pid)
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
        with open(f"/proc/{pid}/stat") as f:
            parent = cmdline(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return "?"
    if "forkserver" in cmd:
        return "worker" if "forkserver" in parent else "forkserver"
    if "ray" in cmd.lower() or comm in ("gcs_server", "raylet"):
        return "ray:" + comm[:15]
    if "exec(eval(sys.stdin" in cmd:
        return "xdist-worker"
    if "pytest" in cmd:
        return "pytest-top"
    if "blitzscale" in cmd:
        return "blitzscale-cli"
    return "other:" + comm[:15]


def main() -> None:
    out = sys.argv[1]
    last: dict[tuple[str, str], int] = {}
    kinds: dict[tuple[str, str], str] = {}
    total: collections.Counter[str] = collections.Counter()
    first = True
    while True:
        now = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parts = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            key, cpu = (pid, parts[19]), int(parts[11]) + int(parts[12])  # (pid, start time)
            now[key] = cpu
            if not first and cpu > last.get(key, 0):
                kinds.setdefault(key, kind(pid))
                total[kinds[key]] += (cpu - last.get(key, 0)) / TCK
        last, first = now, False
        with open(out, "w") as f:
            json.dump({k: round(v, 1) for k, v in total.most_common()}, f, indent=1)
        time.sleep(2)


if __name__ == "__main__":
    main()
