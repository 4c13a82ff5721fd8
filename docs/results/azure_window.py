"""Rows of an Azure LLM trace CSV whose arrival falls in [START, END) seconds after its first
request, written unchanged (header included) to OUT: a window of the hour to simulate alone.

    .venv/bin/python docs/results/azure_window.py blitzscale/data/azure_code_2023.csv /tmp/win.csv 1600 1700

(docs/benchmarks.md, "The whole Azure code trace, as recorded": the 100 s window traced there.)
"""

from __future__ import annotations

import csv
import sys
from datetime import datetime


def _at(stamp: str) -> datetime:
    return datetime.strptime(stamp[:26], "%Y-%m-%d %H:%M:%S.%f")


def main(src: str, out: str, start: float, end: float) -> None:
    with open(src, newline="") as f:
        header, *rows = list(csv.reader(f))
    t0 = _at(rows[0][0])
    keep = [r for r in rows if start <= (_at(r[0]) - t0).total_seconds() < end]
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(keep)
    print(f"{len(keep)} requests")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
