"""`blitzscale bench runs`: finished runs judged by one pair of SLOs, refusals counted apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blitzscale.bench.runs import compare_runs
from blitzscale.cli.main import main
from blitzscale.client.record import RequestRecord, write_records
from blitzscale.errors import InvalidRequestError


def _ok(i: int, send_s: float, ttft_s: float, prompt: int) -> RequestRecord:
    return RequestRecord(
        index=i, scheduled_s=send_s, send_s=send_s, input_tokens=prompt, requested_output_tokens=3,
        output_tokens=3, status="ok", ttft_s=ttft_s, tbts_s=(0.01, 0.01), e2e_s=ttft_s + 0.02,
    )  # fmt: skip


def _run(tmp_path: Path) -> Path:
    records = [
        _ok(0, 0.0, 0.1, 100),  # meets a 450 ms TTFT SLO
        _ok(1, 0.5, 1.5, 300),  # misses it; the last to finish, at 2.02 s
        RequestRecord(
            index=2,
            scheduled_s=0.6,
            send_s=0.6,
            input_tokens=50,
            requested_output_tokens=3,
            output_tokens=0,
            status="error",
            error="HTTP 429: the server is overloaded: ...",
        ),
    ]
    tmp_path.mkdir(parents=True, exist_ok=True)
    write_records(tmp_path / "requests.jsonl", records)
    return tmp_path


def test_runs_are_judged_by_the_given_slos_and_refusals_counted(tmp_path: Path) -> None:
    run = _run(tmp_path)
    out = compare_runs([run], 0.45, 0.15)
    side = out["runs"][str(run)]
    assert (side["requests"], side["ok"], side["refused_overloaded"], side["other_errors"]) == (3, 2, 1, 0)
    assert side["slo_attainment"] == pytest.approx(1 / 3, abs=1e-3)  # the refused one misses too
    assert side["served_prompt_tokens_per_s"] == round(400 / 2.02)
    assert compare_runs([run], 2.0, 0.15)["runs"][str(run)]["slo_attainment"] == pytest.approx(
        2 / 3, abs=1e-3
    )


def test_cli_writes_json_and_names_a_folder_with_no_requests(tmp_path: Path, capsys) -> None:
    run = _run(tmp_path / "a")
    flags = ["--slo-ttft-ms", "450", "--slo-tbt-ms", "150", "--out", str(tmp_path / "o.json")]
    assert main(["bench", "runs", str(run), *flags]) == 0
    assert json.loads((tmp_path / "o.json").read_text())["runs"][str(run)]["ok"] == 2
    assert main(["bench", "runs", str(tmp_path / "empty"), *flags]) == 2
    assert "no requests.jsonl in" in capsys.readouterr().err
    with pytest.raises(InvalidRequestError, match=r"no requests\.jsonl in"):
        compare_runs([tmp_path / "empty"], 0.45, 0.15)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", "no requests in"),
        (b"\n\n", "no requests in"),
        (b'{"send_s": 0}\nnot json\n', "line 1: not a request record"),
        (b"\xff\xfe\n", "not UTF-8 text"),
    ],
)
def test_a_requests_file_that_is_empty_or_not_records_is_named(
    tmp_path: Path, content: bytes, says: str
) -> None:
    run = tmp_path / "r"
    run.mkdir()
    (run / "requests.jsonl").write_bytes(content)
    with pytest.raises(InvalidRequestError, match=says):
        compare_runs([run], 0.45, 0.15)
