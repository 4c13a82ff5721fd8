"""`blitzscale serve` as a user runs it: a bad config is refused with a message naming the
bad value; SIGTERM stops the server and every worker process."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.procs import descendants, parent_pids

CLI = [sys.executable, "-m", "blitzscale.cli.main"]


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ("[planner]\nprefil_upper = 0.7\n", "unknown key 'prefil_upper' in [planner]"),
        ("[clusterr]\nworkers = 2\n", "unknown section [clusterr]"),
        ("[policy]\nname = 'magic'\n", "unknown policy 'magic'"),
        ("[planner\n", "not valid TOML"),
        ("[cluster]\ntransfer_bytes_per_s = -1\n", "transfer_bytes_per_s must be >= 0"),
        ("[cluster]\nmodels_per_rank = -2\n", "models_per_rank must be >= 0 (0: as many as fit), got -2"),
        ("[cluster]\nworker_memory_bytes = -1\n", "worker_memory_bytes must be >= 0 (0: the device's own)"),
        ("[cluster]\nnum_workers = '4'\n", "[cluster] num_workers must be an integer, got '4' (str)"),
        ("[server]\nport = 8000.5\n", "[server] port must be an integer, got 8000.5 (float)"),
        ("[router]\nmax_queue_wait_s = 'long'\n", "[router] max_queue_wait_s must be a number, got 'long'"),
        ("[engine]\nblock_size = true\n", "[engine] block_size must be an integer, got True (bool)"),
        ("[cluster]\ndist_port = 70000\n", "[cluster] dist_port must be in [0, 65535], got 70000"),
        ("[model]\nttft_slo_s = -1\n", "ttft_slo_s must be a number of seconds >= 0 (0: none), got -1"),
        # checked here, not found by a worker after it started
        ("[cluster]\ndtype = 'int3'\n", "dtype must be one of float32, bfloat16, float16 (or ''), got"),
        ("[cluster]\nstartup_timeout_s = -5\n", "startup_timeout_s must be a number of seconds > 0, got -5"),
        ("[cluster]\npiece_bytes = -100\n", "piece_bytes must be >= 0 (0: the default), got -100"),
        ("[router]\nhealth_check_s = 0\n", "health_check_s must be > 0 seconds, got 0"),
        ("[server]\nshutdown_timeout_s = nan\n", "shutdown_timeout_s must be >= 0, got nan"),
        ("[planner]\ninterval_s = -1\n", "interval_s must be > 0 seconds, got -1"),
        ("[policy]\nfixed_prefill = -1\n", "fixed_prefill must be >= 0, got -1"),
        ("[model]\ntokenizer = '/nonexistent'\n", "[model] tokenizer (--tokenizer): model '/nonexistent'"),
        ("[model]\nprofile = '/nonexistent.json'\n", "[model] profile: no profile '/nonexistent.json'"),
        ("[cluster]\nhost = 'nosuchhost.invalid'\n", "[cluster] host: 'nosuchhost.invalid' does not resolve"),
        ("[[models]]\nname = 'a'\nttft_slo_s = nan\n", "model 'a': ttft_slo_s must be a number of seconds"),
        (
            "[policy]\nname = 'fixed'\nfixed_prefill = 2\nfixed_decode = 2\n[cluster]\nnum_workers = 3\n",
            "starts 4 instances ([policy] fixed_prefill + fixed_decode) but there are 3 workers",
        ),
    ],
)
def test_bad_config_is_named(tmp_path: Path, toml: str, needle: str) -> None:
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(toml)
    r = subprocess.run([*CLI, "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert needle in r.stderr, r.stderr


def test_a_config_that_is_not_utf8_text_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from blitzscale.cli.main import main

    cfg = tmp_path / "cluster.toml"
    cfg.write_bytes(b"\x00\xff[cluster]\n")
    assert main(["serve", "--config", str(cfg)]) == 2
    assert f"--config {cfg}: not UTF-8 text, so not TOML" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--transfer-rate", "-5"], "--transfer-rate must be >= 0"),
        (["--kv-blocks", "-3"], "--kv-blocks must be >= 0"),
        (["--requests", "0"], "--requests must be >= 1"),
        (["--paths", "live,warp"], "--paths: unknown path ['warp']"),
    ],
)
def test_bad_bench_live_flag_is_named(flags: list[str], needle: str) -> None:
    r = subprocess.run(
        [*CLI, "bench", "live", "--device", "cpu", *flags], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2
    assert needle in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (
            ["--workers", "1"],
            "mode 'pd' starts 2 instances ([planner] min_prefill + min_decode) but there are 1",
        ),
        (["--workers", "1", "--mode", "pd"], "use --workers 2 or more (or --mode colocated)"),
        (["--tp", "2", "--workers", "2"], "starts 2 instances of tp=2 (4 workers)"),
        (["--port", "99999"], "[server] port (--port) must be in [1, 65535], got 99999"),
        (["--port", "-1"], "must be in [1, 65535], got -1"),
        (["--models-per-rank", "-1"], "--models-per-rank must be >= 0 (0: as many as fit), got -1"),
        (["--ttft-slo", "-0.5"], "ttft_slo_s must be a number of seconds >= 0 (0: none), got -0.5"),
        (["--model", "no-such-model"], "unknown model 'no-such-model'"),
        (
            ["--model", "random:tiny-llama3", "--tokenizer", "random:tiny-llama3", "--mode", "colocated"],
            "tokenizer 'random:tiny-llama3': no tokenizer found there",
        ),
    ],
)
def test_bad_serve_flag_is_refused_before_any_worker_starts(flags: list[str], needle: str) -> None:
    r = subprocess.run([*CLI, "serve", *flags], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_port_in_use_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        cfg = tmp_path / "cluster.toml"
        cfg.write_text("[cluster]\nnum_workers = 1\n[router]\nmode = 'colocated'\n")
        proc = subprocess.Popen(
            [*CLI, "serve", "--config", str(cfg), "--port", str(port)], stderr=subprocess.PIPE, text=True
        )
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err
    assert "serving" not in err and "worker" not in err.lower()


def _family(pid: int) -> tuple[list[int], list[int]]:
    """(children, grandchildren) of `pid`. A server's workers are forked by
    multiprocessing's forkserver, its child (`cluster/spawn.py`): they are grandchildren."""
    parents = parent_pids()
    children = [c for c, p in parents.items() if p == pid]
    return children, [c for c, p in parents.items() if p in children]


def _none_left(pids: list[int], within_s: float = 30.0) -> list[int]:
    """Those of `pids` still running after `within_s` (the forkserver ends once the server
    has, a moment after it)."""
    deadline = time.monotonic() + within_s
    left = pids
    while left and time.monotonic() < deadline:
        left = [w for w in left if Path(f"/proc/{w}").exists() and _alive(w)]
        time.sleep(0.2)
    return left


def _start_serve(tmp_path: Path, toml: str) -> tuple[subprocess.Popen[str], int]:
    """`blitzscale serve` on a free port, once /health answers 200."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(toml)
    proc = subprocess.Popen(
        [*CLI, "serve", "--config", str(cfg), "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read() if proc.stderr else "serve exited")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("server did not come up")
        time.sleep(0.5)


def test_sigterm_stops_everything_without_orphans(tmp_path: Path) -> None:
    proc, _port = _start_serve(tmp_path, "[cluster]\nnum_workers = 2\n[router]\nmode = 'colocated'\n")
    try:
        children, workers = _family(proc.pid)
        assert len(workers) >= 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert _none_left(children + workers) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_cuts_a_request_that_runs_past_the_shutdown_timeout(tmp_path: Path) -> None:
    """A stuck or very long request must not keep the server up: after
    `shutdown_timeout_s` it is cut and the server exits."""
    toml = "[server]\nshutdown_timeout_s = 0.5\n[cluster]\nnum_workers = 1\n"
    toml += "[router]\nmode = 'colocated'\n[policy]\nname = 'fixed'\n"
    proc, port = _start_serve(tmp_path, toml)
    lines: list[str] = []
    started = threading.Event()

    def stream() -> None:
        body = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    lines.append(line)
                    started.set()
        except httpx.HTTPError:
            pass
        finally:
            started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    try:
        assert started.wait(120)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
        reader.join(60)
        assert not any('"finish_reason":"length"' in line for line in lines)  # cut, not finished
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_second_ctrl_c_ends_running_requests_with_their_503_at_once(tmp_path: Path) -> None:
    """Ctrl-C waits for running requests (shutdown_timeout_s, here 120 s); a second one ends
    them now, as the timeout's end would: a JSON 503, a stream's error event and [DONE].
    (uvicorn forced the exit at once: a plain-text 500 and streams cut mid-chunk.)"""
    toml = "[server]\nshutdown_timeout_s = 120\n[cluster]\nnum_workers = 1\n"
    toml += "[router]\nmode = 'colocated'\n[policy]\nname = 'fixed'\n"
    proc, port = _start_serve(tmp_path, toml)
    url = f"http://127.0.0.1:{port}/v1/completions"
    body = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True}
    lines: list[str] = []
    whole: list[httpx.Response] = []
    started = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=300) as r:
            for line in r.iter_lines():
                lines.append(line)
                started.set()

    readers = [
        threading.Thread(target=stream),
        threading.Thread(target=lambda: whole.append(httpx.post(url, json=body, timeout=300))),
    ]
    for t in readers:
        t.start()
    try:
        assert started.wait(120)
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0
        assert time.monotonic() - t0 < 60  # not the 120 s timeout
        for t in readers:
            t.join(60)
        assert whole and whole[0].status_code == 503, whole
        assert whole[0].json()["error"]["message"], whole[0].text
        data = [ln for ln in lines if ln.startswith("data:")]
        assert data[-1] == "data: [DONE]" and '"error"' in data[-2], data[-3:]
    finally:
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_example_config_lists_every_knob_with_its_default() -> None:
    from blitzscale.serve.config import ServeConfig, load_serve_config

    example = Path(__file__).parents[2] / "configs" / "cluster.example.toml"
    assert load_serve_config(example) == ServeConfig()
    assert example.read_text().strip() == ServeConfig().to_toml().strip()


def test_a_short_soak_gives_no_wrong_answer_no_hang_and_no_leak(tmp_path: Path) -> None:
    """`bench soak` end to end, briefly: load above capacity, a worker killed mid-run,
    clients that leave mid-stream; every answer checked."""
    out = tmp_path / "soak.json"
    r = subprocess.run(
        [*CLI, "bench", "soak", "--minutes", "0.4", "--rate-x", "1.5", "--kills", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    result = json.loads(out.read_text())
    assert result["sent"] > 20 and result["ok"] > 0
    assert result["wrong_answers"] == 0, result["wrong_examples"]
    assert result["hung"] == 0 and result["leaked_kv_blocks"] == 0, result["leaked_where"]
    assert result["requests_left_in_router"] == 0
    assert len(result["kills"]) == 1
    assert result["sent"] == result["ok"] + result["shed"] + result["failed"] + result["left_by_client"]


def test_bad_soak_flags_are_named() -> None:
    r = subprocess.run([*CLI, "bench", "soak", "--rate-x", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--rate-x" in r.stderr


def test_sigterm_while_the_workers_start_leaves_no_process(tmp_path: Path) -> None:
    """(Before uvicorn took the signals, SIGTERM's default action ended the server alone:
    its forkserver, resource tracker and starting workers ran on as orphans.)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "cluster.toml"
    cfg.write_text("[cluster]\nnum_workers = 2\n[router]\nmode = 'colocated'\n")
    proc = subprocess.Popen(
        [*CLI, "serve", "--config", str(cfg), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while len(_family(proc.pid)[1]) < 2:  # the forkserver's first workers are forked
            assert proc.poll() is None and time.monotonic() < deadline, "no worker started"
            seen |= descendants(proc.pid)
            time.sleep(0.05)
        seen |= descendants(proc.pid)
        assert not _serving(port)  # (still starting)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 130
        assert _none_left(sorted(seen)) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def _serving(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
