"""`blitzscale bench transfer --dtype fp8`: every path for a model and its FP8 form in one
run, CPU workers: each copy bit-identical to its source, the FP8 one a fraction of the bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blitzscale.cli.main import main


def test_fp8_beside_dense_on_every_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "transfer", "--model", "random:tiny-llama3", "--workers", "2"]
    assert main([*argv, "--mode", "chain,host,disk", "--dtype", "fp8", "--workdir", str(tmp_path)]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["dense"]["model"] == "random:tiny-llama3" and r["fp8"]["model"] == "random:tiny-llama3:fp8"
    for dtype in ("dense", "fp8"):
        for mode in ("chain", "host"):
            assert r[dtype][mode]["targets"] and all(t["identical"] for t in r[dtype][mode]["targets"])
        assert r[dtype]["disk"]["warm"]["bytes"] > 0
    ratios = r["fp8_over_dense"]
    assert set(ratios) == {"chain", "host", "disk"}
    # fp32 on CPU: FP8 linears (1 byte and a scale a row) beside 4-byte ones, the embedding as it is
    assert all(0.3 < ratios[m]["bytes"] < 0.5 for m in ratios), ratios
    assert len({ratios[m]["bytes"] for m in ratios}) == 1  # every path moves the same bytes
    assert all(ratios[m]["GBps"] > 0 for m in ratios)


def test_one_worker_measures_host_and_disk_and_says_why_not_p2p(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One GPU is enough for the host and disk paths; a network mode there is an error in its
    own entry (it once sent to a rank that did not exist and took the whole bench down), and
    the exit status says a mode failed."""
    argv = ["bench", "transfer", "--model", "random:tiny-llama3", "--workers", "1", "--mode", "p2p,host"]
    assert main([*argv, "--dtype", "fp8", "--workdir", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert "p2p failed" in out.err
    r = json.loads(out.out)
    assert "2 workers" in r["fp8"]["p2p"]["error"] and "2 workers" in r["dense"]["p2p"]["error"]
    assert isinstance(r["fp8_over_dense"]["p2p"], str)
    assert 0.3 < r["fp8_over_dense"]["host"]["bytes"] < 0.5


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--model", "smollm2-135m"], "random:NAME"),
        (["--model", "random:tiny-llama3:fp8"], "random:NAME"),
        (["--model", "random:tiny-llama3", "--mode", "hf"], "hf"),
        (["--model", "nosuch"], "unknown model 'nosuch'"),
        (["--model", "random:tiny-llama3", "--readers", "0"], "--readers must be >= 1"),
    ],
)
def test_fp8_refuses_what_it_cannot_compare(
    extra: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused with a message naming the problem, before any worker starts."""
    argv = ["bench", "transfer", "--dtype", "fp8", "--workdir", str(tmp_path), *extra]
    assert main(argv) == 2
    assert named in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written, no model loaded
