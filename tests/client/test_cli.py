"""`blitzscale replay` end to end against the fake server, and its one-line errors."""

import json
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from blitzscale.client.cli import main
from blitzscale.client.record import read_records

from .fake_server import FakeServer

StartServer = Callable[..., AbstractContextManager[FakeServer]]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def processed_trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text("timestamp_ms,prefill,decode\n0,32,3\n100,64,4\n200,5000,900\n")
    return path


def test_replay_writes_results_summary_plots_and_report(
    fake_server: StartServer, processed_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    with fake_server(ttft_s=0.05, tbt_s=0.01) as server:
        argv = ["--url", server.url, "--trace", str(processed_trace), "--format", "processed"]
        argv += ["--max-input", "128", "--max-output", "8", "--slo-ttft", "450", "--slo-tbt", "150"]
        assert main([*argv, "--out", str(out), "--api-key", "k", "--no-progress"]) == 0
    records = read_records(out / "requests.jsonl")
    assert [(r.input_tokens, r.output_tokens, r.status) for r in records] == [
        (32, 3, "ok"),
        (64, 4, "ok"),
        (128, 8, "ok"),
    ]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_ok"] == 3 and summary["slo_attainment"] == 1.0
    assert summary["slo"]["ttft_s"] == 0.45 and summary["slo"]["tbt_rule"] == "given"
    assert summary["options"]["api_key"] == "***"
    for name in ("ttft_over_time.png", "ttft_cdf.png", "tbt_cdf.png"):
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "slo_attainment" in page
    assert "3/3 ok" in capsys.readouterr().out


def test_gamma_arrivals_with_fixed_lengths(fake_server: StartServer, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with fake_server() as server:
        argv = ["--url", server.url, "--gamma", "20,1", "--duration", "0.5", "--input-len", "7"]
        assert main([*argv, "--output-len", "2", "--out", str(out), "--no-progress"]) == 0
    records = read_records(out / "requests.jsonl")
    assert records and all((r.input_tokens, r.output_tokens) == (7, 2) for r in records)
    assert all(r.scheduled_s < 0.5 for r in records)


def test_all_requests_failing_exits_1(
    fake_server: StartServer, processed_trace: Path, tmp_path: Path
) -> None:
    with fake_server(status=500) as server:
        argv = ["--url", server.url, "--trace", str(processed_trace), "--format", "processed"]
        assert main([*argv, "--out", str(tmp_path / "o"), "--no-progress"]) == 1
    assert (tmp_path / "o" / "requests.jsonl").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gamma", "3", "--duration", "1"], "--gamma expects RATE,CV, got '3'"),
        (["--gamma", "0,1", "--duration", "1"], "--gamma expects RATE > 0 and CV >= 0, got '0,1'"),
        (["--gamma", "3,1"], "--gamma needs --duration"),
        (
            ["--trace", "TRACE", "--format", "tsv"],
            "--format expects one of azure, burstgpt, mooncake, processed",
        ),
        (
            ["--trace", "TRACE", "--format", "processed", "--time-scale", "0"],
            "--time-scale expects a number > 0",
        ),
        (
            ["--trace", "TRACE", "--format", "processed", "--max-input", "1.5"],
            "--max-input expects an integer",
        ),
        (["--trace", "TRACE", "--format", "processed", "--protocol", "grpc"], "--protocol expects one of"),
        (["--trace", "TRACE", "--format", "processed", "--slo-ttft", "fast"], "--slo-ttft expects a number"),
        (
            ["--trace", "TRACE", "--format", "processed", "--protocol", "tgi", "--token-ids"],
            "--token-ids needs --protocol openai, got 'tgi'",
        ),
        (
            ["--trace", "TRACE", "--format", "mooncake", "--hash-block-tokens", "0"],
            "--hash-block-tokens expects an integer >= 1, got '0'",
        ),
        (
            ["--trace", "TRACE", "--format", "mooncake", "--hash-block-tokens", "8.5"],
            "--hash-block-tokens expects an integer >= 1, got '8.5'",
        ),
        (["--trace", "TRACE"], "--format is required with --trace"),
        # flags a run of this kind would ignore
        (
            ["--trace", "TRACE", "--format", "processed", "--hash-block-tokens", "64"],
            "--hash-block-tokens applies only to --format mooncake",
        ),
        (
            ["--trace", "TRACE", "--format", "azure", "--skip-failed"],
            "--skip-failed applies only to --format burstgpt",
        ),
        (
            ["--trace", "TRACE", "--format", "processed", "--input-len", "64"],
            "--input-len applies only to --gamma arrivals without --trace",
        ),
        (["--trace", "missing.csv", "--format", "azure"], "--trace: no such file 'missing.csv'"),
        ([], "give --trace PATH --format FMT, or --gamma RATE,CV --duration S"),
        (["--gamma", "1,1", "--duration", "1", "--seed", "-1"], "--seed must be in [0, 2^32), got -1"),
    ],
)
def test_bad_values_give_one_line_and_exit_2(
    processed_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    extra = [str(processed_trace) if a == "TRACE" else a for a in extra]
    argv = ["--url", "http://127.0.0.1:1", "--out", str(tmp_path / "o"), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("blitzscale replay: error: ")
    assert message in err


def test_bad_url_and_bad_trace_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("0,1,1\n1,x,1\n")
    assert (
        main(["--url", "localhost:8000", "--trace", str(trace), "--format", "processed", "--out", "o"]) == 2
    )
    assert "--url expects http://HOST:PORT" in capsys.readouterr().err
    for url, says in (
        ("http://127.0.0.1:99999", "Port out of range"),
        ("http://", "a host and a port in [1, 65535]"),
    ):
        assert main(["--url", url, "--trace", str(trace), "--format", "processed", "--out", "o"]) == 2
        assert says in capsys.readouterr().err
    argv = ["--url", "http://127.0.0.1:1", "--trace", str(trace), "--format", "processed", "--out", "o"]
    assert main(argv) == 1
    assert f"{trace} line 2: prefill must be an integer, got 'x'" in capsys.readouterr().err


def test_runs_as_a_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "blitzscale.client.cli", "--help"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0 and "--rate-scale" in done.stdout


def test_add_replay_parser_plugs_into_a_main_parser(processed_trace: Path) -> None:
    import argparse

    from blitzscale.client.cli import add_replay_parser

    parser = argparse.ArgumentParser(prog="blitzscale")
    add_replay_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["replay", "--url", "http://x:1", "--trace", str(processed_trace), "--out", "o"])
    assert (args.command, args.format, args.time_scale) == ("replay", None, None)
