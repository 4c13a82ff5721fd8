"""`blitzscale serve --cluster ray` as a user runs it: with no address it starts a Ray
instance of its own, serves the openai client, and Ctrl-C (SIGINT to the terminal's process
group) leaves no actor, no worker and no Ray process behind. Bad flags are refused, naming
the value, before any worker starts."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.procs import descendants
from tests.serve.test_cli_serve import _alive
from tests.serve.test_http import PROMPTS

CLI = [sys.executable, "-m", "blitzscale.cli.main"]


def test_serve_on_its_own_ray_instance_and_ctrl_c_leaves_nothing(
    smollm2_engine_texts: list[str], no_shared_ray: None
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flags = ["--cluster", "ray", "--workers", "2", "--mode", "colocated", "--port", str(port)]
    proc = subprocess.Popen(
        [*CLI, "serve", *flags, "--log-level", "warning", "--no-access-log"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else "serve exited"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.5)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=180)
        done = c.completions.create(model="smollm2-135m", prompt=PROMPTS[0], max_tokens=16, temperature=0)
        assert done.choices[0].text == smollm2_engine_texts[0]
        family = descendants(proc.pid)
        names = " ".join(_cmdline(p) for p in family)
        assert "raylet" in names and "gcs_server" in names, names  # Ray started by serve itself
        assert sum("WorkerActorBody" in _cmdline(p) for p in family) == 2, names
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=120) == 0
        deadline = time.monotonic() + 60
        left = family
        while left and time.monotonic() < deadline:
            left = [p for p in left if _alive(p)]
            time.sleep(0.2)
        assert not left, [_cmdline(p) for p in left]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--ray-address", "auto"], "ray_address 'auto' (--ray-address) needs backend 'ray' (--cluster ray)"),
        (["--cluster", "mesos"], "invalid choice: 'mesos'"),
    ],
)
def test_bad_ray_flags_are_refused_before_any_worker_starts(flags: list[str], needle: str) -> None:
    r = subprocess.run([*CLI, "serve", *flags], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ("[cluster]\nbackend = 'mesos'\n", "backend must be one of local, ray, got 'mesos'"),
        ("[cluster]\nbackend = 'ray'\nranks_per_host = 2\n", "ranks_per_host 2 emulates hosts"),
    ],
)
def test_bad_backend_in_the_file_is_named(tmp_path, toml: str, needle: str) -> None:
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(toml)
    r = subprocess.run([*CLI, "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_an_address_where_no_ray_cluster_answers_is_refused_at_once() -> None:
    ports = []
    for _ in range(2):  # one nothing listens on (the Ray address), one for HTTP
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    port, http = ports
    flags = ["--cluster", "ray", "--ray-address", f"127.0.0.1:{port}", "--workers", "2"]
    flags += ["--mode", "colocated", "--port", str(http)]
    r = subprocess.run([*CLI, "serve", *flags], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"no Ray cluster answers at '127.0.0.1:{port}' (--ray-address)" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
