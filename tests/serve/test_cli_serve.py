"""`blitzscale serve` as a user runs it: a bad config is refused with a message naming the
bad value; SIGTERM stops the server and every worker process."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

CLI = [sys.executable, "-m", "blitzscale.cli.main"]


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ("[planner]\nprefil_upper = 0.7\n", "unknown key 'prefil_upper' in [planner]"),
        ("[clusterr]\nworkers = 2\n", "unknown section [clusterr]"),
        ("[policy]\nname = 'magic'\n", "unknown policy 'magic'"),
        ("[planner\n", "not valid TOML"),
        ("[cluster]\ntransfer_bytes_per_s = -1\n", "transfer_bytes_per_s must be >= 0"),
    ],
)
def test_bad_config_is_named(tmp_path: Path, toml: str, needle: str) -> None:
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(toml)
    r = subprocess.run([*CLI, "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert needle in r.stderr, r.stderr


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


def _children(pid: int) -> list[int]:
    kids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(d.name))
            except (OSError, IndexError, ValueError):
                continue
    return kids


def test_sigterm_stops_everything_without_orphans(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "cluster.toml"
    cfg.write_text("[cluster]\nnum_workers = 2\n[router]\nmode = 'colocated'\n")
    proc = subprocess.Popen(
        [*CLI, "serve", "--config", str(cfg), "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.5)
        workers = _children(proc.pid)
        assert len(workers) >= 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        time.sleep(0.5)
        assert [w for w in workers if Path(f"/proc/{w}").exists() and _alive(w)] == []
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
