"""Bad templates fail before anything runs, with one line that names the bad value."""

from __future__ import annotations

from pathlib import Path

import pytest

from blitzscale.errors import InvalidRequestError
from tests.batch.conftest import plan_of

GOOD = """
[experiment]
policies = ["blitz"]
traces = [{ path = "trace.csv", format = "processed" }]
"""

CASES = [
    ("unknown section", GOOD + "[routr]\nmode = 'pd'\n", "routr"),
    ("unknown key", GOOD + "[router]\nmdoe = 'pd'\n", "mdoe"),
    ("unknown experiment key", GOOD.replace("[experiment]", "[experiment]\nseeds = [1]"), "seeds"),
    ("missing trace", GOOD.replace("trace.csv", "nowhere.csv"), "nowhere.csv"),
    ("unknown policy", GOOD.replace('"blitz"', '"blitz", "blitzz"'), "blitzz"),
    ("unknown format", GOOD.replace('"processed"', '"csvish"'), "csvish"),
    (
        "unknown model",
        GOOD.replace("[experiment]", '[experiment]\nmodels = ["no-such-model"]'),
        "no-such-model",
    ),
    ("unknown router mode", GOOD + "[router]\nmode = ['pd', 'disagg']\n", "disagg"),
    ("wrong type", GOOD + "[planner]\nscale_down_idle_s = 'fast'\n", "fast"),
    ("bool for int", GOOD + "[cluster]\nnum_workers = true\n", "num_workers"),
    ("empty list", GOOD + "[planner]\nscale_down_idle_s = []\n", "scale_down_idle_s"),
    ("duplicate value", GOOD + "[engine]\nnum_kv_blocks = [64, 64]\n", "64"),
    ("policy set twice", GOOD + "[policy]\nname = 'sllm'\n", "policies"),
    ("bad trace knob", GOOD.replace('"processed"', '"processed", rate_scale = -1'), "rate_scale"),
    ("negative cv", GOOD.replace('"processed"', '"processed", cv = -0.5'), "cv"),
    ("float seed", GOOD.replace('"processed"', '"processed", cv = 2, seed = 1.5'), "seed"),
    ("seed without cv", GOOD.replace('"processed"', '"processed", seed = [0, 1]'), "without cv"),
    (
        "bad combination",
        GOOD + "[planner]\nprefill_upper = 0.7\nprefill_lower = [0.5, 0.9]\n",
        "prefill_lower",
    ),
    ("no experiment", "[router]\nmode = 'pd'\n", "[experiment]"),
    ("not toml", "[experiment\n", "not valid TOML"),
]


@pytest.mark.parametrize(("text", "named"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_template_names_the_bad_value(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        plan_of(tmp_path, text)
    message = str(info.value)
    assert named in message
    assert "\n" not in message


def test_a_trace_file_that_does_not_parse_is_caught_before_running(tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text("timestamp_ms,prefill,decode\n0,ten,4\n")
    with pytest.raises(InvalidRequestError, match="ten"):
        plan_of(tmp_path, GOOD.replace("trace.csv", "bad.csv"))


def test_a_trace_without_requests_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.csv").write_text("timestamp_ms,prefill,decode\n")
    with pytest.raises(InvalidRequestError, match=r"empty\.csv.*no requests"):
        plan_of(tmp_path, GOOD.replace("trace.csv", "empty.csv"))
