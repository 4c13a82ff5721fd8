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
import resource
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
from blitzscale.engine.work import StepTally, kinds_between

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


KIND_FAMILIES = {
    "steps": "blitzscale_engine_kind_steps",
    "seconds": "blitzscale_engine_kind_step_seconds",
    "overlapped": "blitzscale_engine_kind_overlapped_steps",
    "tokens": "blitzscale_engine_kind_tokens",
}


@dataclass
class WorkerTime:
    """The worker counters a scrape of `/metrics` gives: totals, and per kind of step."""

    totals: dict[str, float]
    kinds: StepTally


async def worker_time(url: str) -> WorkerTime:
    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(f"{url}/metrics")).text
    out = dict.fromkeys(WORKER_TIME, 0.0)
    tally = StepTally()
    field_of = {v: k for k, v in KIND_FAMILIES.items()}
    for fam in text_string_to_metric_families(text):
        if fam.name in out:
            out[fam.name] = sum(s.value for s in fam.samples if s.name.endswith("_total"))
        elif fam.name in field_of:
            for s in fam.samples:
                if s.name.endswith("_total") and s.labels.get("kind") in tally.kinds:
                    t = tally.kinds[s.labels["kind"]]
                    setattr(t, field_of[fam.name], getattr(t, field_of[fam.name]) + s.value)
    return WorkerTime(out, tally)


def breakdown(before: WorkerTime, after: WorkerTime, wall_s: float) -> dict[str, Any]:
    """Where one mix's time went on the worker: steps, ms a step, the loop's time outside
    the engine a step, the share of the mix's wall time the worker had work, and the
    steps by kind (`kinds`: each kind's steps, ms a step, overlapped share, tokens a step)."""
    b, a = before.totals, after.totals
    steps = a[WORKER_TIME[0]] - b[WORKER_TIME[0]]
    step_s = a[WORKER_TIME[1]] - b[WORKER_TIME[1]]
    busy_s = a[WORKER_TIME[2]] - b[WORKER_TIME[2]]
    per = 1000 / steps if steps else float("nan")
    return {
        "steps": steps,
        "step_ms": round(step_s * per, 3),
        "loop_outside_step_ms": round((busy_s - step_s) * per, 3),
        "busy_share": round(busy_s / wall_s, 3) if wall_s else float("nan"),
        "kinds": kinds_between(before.kinds, after.kinds),
    }


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used so far; NaN where
    /proc cannot say (the router and HTTP edge's share of a core, per mix)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def client_cpu_seconds() -> float:
    """CPU seconds of this process and of its client processes that have ended."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


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
            cpu0, client0 = cpu_seconds(server.proc.pid), client_cpu_seconds()
            result = await (fn(mix) if name in ("single", "burst") else fn())
            wall = time.perf_counter() - t
            out[name] = result
            out[f"{name}_worker"] = {
                **breakdown(before, await worker_time(server.url), wall),
                # the server process (router, HTTP edge) and this client, in cores busy
                "server_cpu_share": round((cpu_seconds(server.proc.pid) - cpu0) / wall, 3),
                "client_cpu_share": round((client_cpu_seconds() - client0) / wall, 3),
            }
    finally:
        await load.close()
    return out


def served_profile(cfg: ServeBenchConfig) -> dict[str, Any] | None:
    """The cost model the server's worker measured (or read back), from the cache folder
    it keeps it in, under the key the worker used; None if it is not there."""
    import torch

    from blitzscale.engine.engine import default_dtype
    from blitzscale.serve.config import ServeConfig
    from blitzscale.serve.costs import profiles_dir
    from blitzscale.worker import costprobe

    serve = ServeConfig()
    device = torch.device(cfg.device)
    config = load_config(resolve_model(cfg.model))
    engine = serve.engine.for_device(device.type)
    key = costprobe.cache_key(config, default_dtype(device), device, engine, costprobe.WORKER_THREADS)
    profile = costprobe.cached_profile(profiles_dir(serve), key)
    return profile.to_json() if profile is not None else None


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
        # the cost model whole, for `bench serve --simulate` (/health shows a summary)
        "server": {"health": served.pop("health"), "log_tail": log_tail, "profile": served_profile(cfg)},
    }
    alone = run_engine_mixes(cfg.model, cfg.device, cfg.mix) if cfg.engine_alone else {}
    for name in ["single", "burst", *(f"closed_{n}" for n in cfg.mix.streams)]:
        entry: dict[str, Any] = {"served": asdict(served[name]), "worker": served[f"{name}_worker"]}
        if name in alone:
            entry["engine_alone"] = asdict(alone[name])  # type: ignore[call-overload]
            if f"{name}_kinds" in alone:
                entry["engine_alone_kinds"] = alone[f"{name}_kinds"]
            entry["ratio"] = compare(served[name], alone[name])
        result[name] = entry
    return result
