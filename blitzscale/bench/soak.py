"""`blitzscale bench soak`: open-loop load above capacity, with scale events and worker
kills, checking every answer.

1. A cluster starts (pd mode by default, policy blitz) and serves a fixed set of prompts
   greedily one at a time: those texts are the answers every later reply must equal.
2. Capacity: a batch of concurrent requests on the first instances gives their rate,
   scaled to every worker (what the planner could provision at most).
3. For `minutes`, requests arrive open-loop (Poisson) at `rate_x` times that rate over
   HTTP, as a client would send them: most wait for the whole answer, some stream, and
   some of the streams leave after their first chunk (the KV hand-off is under way then).
   Meanwhile workers are killed at random (keeping `min_alive`).
4. Afterwards the cluster must go idle: no request left, no KV block used.

Prints JSON: sent, ok, shed (429), failed by error, hung (no answer within the client's
timeout), wrong answers, leaked KV blocks, kills, worker restarts.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from blitzscale.serve.background import BackgroundService
from blitzscale.serve.config import ServeConfig

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, a dragon",
    "Water boils at",
    "The three primary colors are",
    "In 1969, humans first",
    "A haiku about autumn:",
    "import numpy as np\n",
    "The largest planet in the solar system is",
    "To make a cup of tea, first",
    "SELECT name FROM users WHERE",
    "The opposite of hot is",
)


@dataclass(frozen=True)
class SoakConfig:
    minutes: float = 30.0
    rate_x: float = 2.0  # offered load, in multiples of the measured capacity
    workers: int = 4
    mode: str = "pd"
    policy: str = "blitz"
    max_tokens: int = 16
    kills: int = 2  # workers killed during the run, spread evenly (0: none)
    min_alive: int = 2  # never kill below this many workers
    stream_share: float = 0.3  # requests that stream
    leave_share: float = 0.3  # of the streams: the client leaves after the first chunk
    client_timeout_s: float = 300.0  # a request with no answer by then counts as hung
    seed: int = 0

    def __post_init__(self) -> None:
        if self.minutes <= 0 or self.rate_x <= 0:
            raise ValueError("--minutes and --rate-x must be > 0")
        if self.kills < 0 or self.min_alive < 1 or self.workers < 2:
            raise ValueError("need --kills >= 0, --min-alive >= 1 and --workers >= 2")


def _serve_config(cfg: SoakConfig) -> ServeConfig:
    return ServeConfig().with_overrides(
        cluster={"num_workers": cfg.workers},
        router={"mode": cfg.mode},
        policy={"name": cfg.policy},
    )


class _Soak:
    def __init__(self, cfg: SoakConfig, url: str, svc: BackgroundService) -> None:
        self.cfg = cfg
        self.url = url
        self.svc = svc
        self.rng = random.Random(cfg.seed)
        self.answers: dict[str, str] = {}
        self.outcomes: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.wrong: list[dict[str, str]] = []
        self.kills: list[dict[str, Any]] = []

    def _body(self, prompt: str, stream: bool = False) -> dict[str, Any]:
        return {"prompt": prompt, "max_tokens": self.cfg.max_tokens, "temperature": 0, "stream": stream}

    async def record_answers(self, client: httpx.AsyncClient) -> None:
        for p in PROMPTS:
            r = await client.post(f"{self.url}/v1/completions", json=self._body(p))
            r.raise_for_status()
            self.answers[p] = r.json()["choices"][0]["text"]

    async def capacity(self, client: httpx.AsyncClient) -> float:
        """What the whole cluster would serve once scaled to every worker: the rate of the
        first instances on a batch sent at once, times workers per first instance."""
        router = self.svc.service.router
        assert router is not None
        first = sum(1 for i in router.instances.values() if i.accepts is not None)
        n = 2 * len(PROMPTS)
        t0 = time.monotonic()
        rs = await asyncio.gather(
            *(
                client.post(f"{self.url}/v1/completions", json=self._body(PROMPTS[i % len(PROMPTS)]))
                for i in range(n)
            )
        )
        for r in rs:
            r.raise_for_status()
        return n / (time.monotonic() - t0) * self.cfg.workers / max(1, first)

    async def one(self, client: httpx.AsyncClient) -> None:
        prompt = self.rng.choice(PROMPTS)
        stream = self.rng.random() < self.cfg.stream_share
        leave = stream and self.rng.random() < self.cfg.leave_share
        try:
            async with asyncio.timeout(self.cfg.client_timeout_s):
                if stream:
                    await self._stream(client, prompt, leave)
                else:
                    r = await client.post(f"{self.url}/v1/completions", json=self._body(prompt))
                    self._judge(prompt, r.status_code, r.json() if r.content else {})
        except TimeoutError:
            self.outcomes["hung"] += 1
        except httpx.HTTPError as e:
            self.outcomes["failed"] += 1
            self.errors[f"client: {type(e).__name__}"] += 1

    async def _stream(self, client: httpx.AsyncClient, prompt: str, leave: bool) -> None:
        import json

        text, finished, error = "", False, None
        async with client.stream("POST", f"{self.url}/v1/completions", json=self._body(prompt, True)) as r:
            if r.status_code != 200:
                await r.aread()
                self._judge(prompt, r.status_code, r.json())
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    error = event
                    break
                choice = event["choices"][0]
                text += choice["text"]
                finished = finished or choice["finish_reason"] is not None
                if leave:
                    self.outcomes["left"] += 1
                    return  # leaving the block closes the connection mid-stream
        if error is not None:  # after the 200 went out: the event's type tells what it was
            kind = error["error"].get("type")
            self._judge(prompt, 429 if kind == "rate_limit_error" else f"stream {kind}", error)
        elif finished:
            self._judge(prompt, 200, {"choices": [{"text": text}]})
        else:
            self.outcomes["failed"] += 1
            self.errors["stream ended without a finish"] += 1

    def _judge(self, prompt: str, status: int | str, body: dict[str, Any]) -> None:
        if status == 200:
            text = body["choices"][0]["text"]
            if text == self.answers[prompt]:
                self.outcomes["ok"] += 1
            else:
                self.outcomes["wrong"] += 1
                self.wrong.append({"prompt": prompt, "expected": self.answers[prompt], "got": text})
        elif status == 429:
            self.outcomes["shed"] += 1
        else:
            self.outcomes["failed"] += 1
            message = str(body.get("error", {}).get("message", ""))[:80]
            self.errors[f"{status}: {message}"] += 1

    async def kill_workers(self, duration_s: float) -> None:
        cluster = self.svc.service.cluster
        assert cluster is not None
        for k in range(self.cfg.kills):
            await asyncio.sleep(duration_s / (self.cfg.kills + 1))
            alive = cluster.alive_ranks()
            if len(alive) <= self.cfg.min_alive:
                break
            rank = self.rng.choice(alive)
            os.kill(cluster.procs[rank].pid, signal.SIGKILL)
            self.kills.append({"at_s": round((k + 1) * duration_s / (self.cfg.kills + 1), 1), "rank": rank})

    async def load(self, client: httpx.AsyncClient, rate: float, duration_s: float) -> int:
        tasks: list[asyncio.Task[None]] = []
        t_end = time.monotonic() + duration_s
        killer = asyncio.create_task(self.kill_workers(duration_s))
        while time.monotonic() < t_end:
            tasks.append(asyncio.create_task(self.one(client)))
            await asyncio.sleep(self.rng.expovariate(rate))
        await asyncio.gather(*tasks)
        await killer
        return len(tasks)

    async def leaked_blocks(self) -> tuple[int, int, dict[str, dict[str, Any]]]:
        """(requests still in the router, KV blocks still used, and per instance holding
        some: its state and what its engine holds by status) once idle, or at the limit."""
        router = self.svc.service.router
        assert router is not None
        deadline = time.monotonic() + 120
        while True:
            await asyncio.sleep(1.0)  # stats arrive every 50 ms; give stragglers time
            holding = {
                str(i.id): i
                for i in router.instances.values()
                if i.stats is not None
                and i.stats.used_blocks
                and i.rank in router.connected
                and i.rank not in router.dead_ranks
            }
            used = sum(i.stats.used_blocks for i in holding.values())
            if (not router.reqs and used == 0) or time.monotonic() > deadline:
                where = {
                    k: {
                        "rank": i.rank,
                        "state": i.state.value,
                        "used_blocks": i.stats.used_blocks,
                        "running": i.stats.num_running,
                        "waiting": i.stats.num_waiting,
                        "held": i.stats.num_held,
                        "live": i.stats.num_live,
                    }
                    for k, i in holding.items()
                }
                return len(router.reqs), used, where


async def _soak(cfg: SoakConfig, svc: BackgroundService) -> dict[str, Any]:
    soak = _Soak(cfg, svc.url, svc)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=cfg.client_timeout_s, limits=limits) as client:
        await soak.record_answers(client)
        capacity = await soak.capacity(client)
        rate = cfg.rate_x * capacity
        t0 = time.monotonic()
        sent = await soak.load(client, rate, cfg.minutes * 60)
        load_s = time.monotonic() - t0
    left_in_router, leaked, leaked_where = await asyncio.wrap_future(
        asyncio.run_coroutine_threadsafe(soak.leaked_blocks(), svc.lt.loop)
    )
    scaler = svc.service.scaler
    events = scaler.events if scaler is not None else []
    router = svc.service.router
    return {
        "config": asdict(cfg),
        "capacity_req_per_s": round(capacity, 3),
        "offered_req_per_s": round(rate, 3),
        "load_s": round(load_s, 1),
        "sent": sent,
        "ok": soak.outcomes["ok"],
        "shed": soak.outcomes["shed"],
        "left_by_client": soak.outcomes["left"],
        "failed": soak.outcomes["failed"],
        "failed_by_error": dict(soak.errors.most_common()),
        "hung": soak.outcomes["hung"],
        "wrong_answers": soak.outcomes["wrong"],
        "wrong_examples": soak.wrong[:5],
        "requests_left_in_router": left_in_router,
        "leaked_kv_blocks": leaked,
        "leaked_where": leaked_where,
        "kills": soak.kills,
        "worker_restarts": router.respawner.restarts if router is not None else 0,
        "workers_alive_at_end": len(svc.service.cluster.alive_ranks()) if svc.service.cluster else 0,
        "scale_ups": sum(1 for e in events if e.is_up),
        "scale_downs": sum(1 for e in events if e.direction == "down"),
        "refused_by_router": dict(router.num_refused) if router is not None else {},
    }


def run_soak(cfg: SoakConfig) -> dict[str, Any]:
    with BackgroundService(_serve_config(cfg)) as svc:
        return asyncio.run(_soak(cfg, svc))
