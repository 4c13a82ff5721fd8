"""Gamma arrivals in a batch's trace tables (`cv`, `seed`: the paper's three seeds of Gamma
arrivals per figure): a seed list fans out, each seed re-times the same requests in order
at the trace's mean rate over its span, the same seed gives the same run, and without a
`cv` the trace keeps its own timestamps (and its runs' ids and parameters)."""

from __future__ import annotations

import itertools
from pathlib import Path

from blitzscale.batch.traces import load_requests
from tests.batch.conftest import plan_of

TEMPLATE = """
[experiment]
name = "gamma"
models = ["random:tiny-llama3"]
policies = ["blitz"]
traces = [
  { path = "demo", cv = 2.0, seed = [0, 1, 2] },
  { path = "demo" },
]
"""


def test_seeds_fan_out_and_retime_the_same_requests(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, TEMPLATE)
    specs = sorted({r.trace for r in plan.runs}, key=lambda t: (t.cv is None, t.seed))
    assert [(t.cv, t.seed) for t in specs] == [(2.0, 0), (2.0, 1), (2.0, 2), (None, 0)]
    assert len({r.run_id for r in plan.runs}) == 4 and any("seed1" in r.run_id for r in plan.runs)
    assert len({r.params_hash for r in plan.runs}) == 4
    own = load_requests(specs[-1])
    assert "seed" not in specs[-1].params() and "cv" not in specs[-1].params()
    draws = [load_requests(t) for t in specs[:3]]
    span = own[-1].arrival_s - own[0].arrival_s
    for d in draws:
        assert d[0].arrival_s == 0.0 and max(r.arrival_s for r in d) <= span
        # about the trace's count over the same span (a Gamma count, cv 2: within half)
        assert 0.5 * len(own) < len(d) < 1.5 * len(own)
        # lengths in the trace's order
        assert [(r.input_tokens, r.output_tokens) for r in d[:50]] == [
            (r.input_tokens, r.output_tokens) for r in own[:50]
        ]
    times = [[r.arrival_s for r in d] for d in draws]
    assert times[0] != times[1] != times[2]  # each seed its own draw
    assert [r.arrival_s for r in load_requests(specs[0])] == times[0]  # a seed is a run
    assert specs[0].describe().endswith("gamma cv2 seed0")


def test_cv_zero_spaces_requests_evenly(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, TEMPLATE.replace("cv = 2.0, seed = [0, 1, 2]", "cv = 0"))
    spec = next(r.trace for r in plan.runs if r.trace.cv == 0)
    reqs = load_requests(spec)
    gaps = {round(b.arrival_s - a.arrival_s, 6) for a, b in itertools.pairwise(reqs)}
    assert len(gaps) == 1
