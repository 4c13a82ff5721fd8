"""`blitzscale bench serve`: what `serve` delivers against what its engine can, in one run.

Starts `blitzscale serve` as its own process with the default configuration on the given
device and model (one worker, one colocated instance, never scaled: the only settings a
one-GPU comparison needs), drives the fixed mixes of bench/mixes.py through its HTTP API,
reads where the worker's time went from `/metrics`, stops it, then drives the same mixes
through the engine alone (`serve`'s engine configuration for the device, no HTTP, no
router, no worker loop). Prints JSON: per mix both figures and their ratios.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from blitzscale.bench.engine_load import run_engine_mixes
from blitzscale.bench.mixes import Mix, compare
from blitzscale.bench.serve_load import HttpLoad
from blitzscale.checkpoint import load_config, resolve_model

WORKER_TIME = ("blitzscale_engine_steps", "blitzscale_engine_step_seconds", "blitzscale_worker_busy_seconds")


@dataclass(frozen=True)
class ServeBenchConfig:
    model: str = "random:llama3-8b"
    device: str = "cuda"
    mix: Mix = field(default_factory=Mix)
    start_timeout_s: float = 1200.0  # a first random 8B is written to disk (~100 s) before serving
    engine_alone: bool = True


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cluster_toml(cfg: ServeBenchConfig) -> str:
    return "\n".join(
        [
            "[model]",
            f'name = "{cfg.model}"',
            "[cluster]",
            f'device = "{cfg.device}"',
            "num_workers = 1",
            "[router]",
            'mode = "colocated"',
            "[policy]",
            'name = "fixed"',
            "fixed_prefill = 1",
            "fixed_decode = 0",
            "",
        ]
    )


class ServerProcess:
    """`blitzscale serve` in a process of its own (its own GIL, as a user runs it)."""

    def __init__(self, cfg: ServeBenchConfig, workdir: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        conf = workdir / "cluster.toml"
        conf.write_text(_cluster_toml(cfg))
        self.log = workdir / "serve.log"
        cmd = [sys.executable, "-m", "blitzscale.cli.main", "serve", "--config", str(conf)]
        cmd += ["--port", str(self.port), "--no-access-log"]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())

    async def ready(self, timeout_s: float) -> dict[str, Any]:
        end = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=5) as c:
            while time.monotonic() < end:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"serve exited with {self.proc.returncode}:\n{self.tail()}")
                try:
                    r = await c.get(f"{self.url}/health")
                    if r.status_code == 200 and r.json().get("status") == "ok":
                        return dict(r.json())
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(1.0)
        raise TimeoutError(f"serve was not ready within {timeout_s:g} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def worker_time(url: str) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(f"{url}/metrics")).text
    out = dict.fromkeys(WORKER_TIME, 0.0)
    for fam in text_string_to_metric_families(text):
        if fam.name in out:
            out[fam.name] = sum(s.value for s in fam.samples if s.name.endswith("_total"))
    return out


def breakdown(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, float]:
    """Where one mix's time went on the worker: steps, ms a step, the loop's time outside
    the engine a step, and the share of the mix's wall time the worker had work."""
    steps = after[WORKER_TIME[0]] - before[WORKER_TIME[0]]
    step_s = after[WORKER_TIME[1]] - before[WORKER_TIME[1]]
    busy_s = after[WORKER_TIME[2]] - before[WORKER_TIME[2]]
    per = 1000 / steps if steps else float("nan")
    return {
        "steps": steps,
        "step_ms": round(step_s * per, 3),
        "loop_outside_step_ms": round((busy_s - step_s) * per, 3),
        "busy_share": round(busy_s / wall_s, 3) if wall_s else float("nan"),
    }


async def _served(cfg: ServeBenchConfig, server: ServerProcess) -> dict[str, Any]:
    health = await server.ready(cfg.start_timeout_s)
    mix = cfg.mix
    vocab = load_config(resolve_model(cfg.model)).vocab_size  # (prompts are token ids)
    load = HttpLoad(server.url, cfg.model, vocab, max(mix.streams) + mix.burst + 8)
    out: dict[str, Any] = {"health": health}
    try:
        await load.single(mix)  # warm-up (first requests of a fresh server are slower)
        runs: list[tuple[str, Any]] = [("single", load.single), ("burst", load.burst)]
        runs += [(f"closed_{n}", lambda n=n: load.closed_loop(mix, n)) for n in mix.streams]
        for name, fn in runs:
            before, t = await worker_time(server.url), time.perf_counter()
            result = await (fn(mix) if name in ("single", "burst") else fn())
            wall = time.perf_counter() - t
            out[name] = result
            out[f"{name}_worker"] = breakdown(before, await worker_time(server.url), wall)
    finally:
        await load.close()
    return out


def run_serve_bench(cfg: ServeBenchConfig) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        server = ServerProcess(cfg, Path(tmp))
        try:
            served = asyncio.run(_served(cfg, server))
        finally:
            server.stop()
            log_tail = server.tail(15)
    result: dict[str, Any] = {
        "model": cfg.model,
        "device": cfg.device,
        "mix": asdict(cfg.mix),
        "server": {"health": served.pop("health"), "log_tail": log_tail},
    }
    alone = run_engine_mixes(cfg.model, cfg.device, cfg.mix) if cfg.engine_alone else {}
    for name in ["single", "burst", *(f"closed_{n}" for n in cfg.mix.streams)]:
        entry: dict[str, Any] = {"served": asdict(served[name]), "worker": served[f"{name}_worker"]}
        if name in alone:
            entry["engine_alone"] = asdict(alone[name])  # type: ignore[call-overload]
            entry["ratio"] = compare(served[name], alone[name])
        result[name] = entry
    return result
