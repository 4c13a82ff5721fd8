"""`blitzscale bench steady`: does a steady load make the cluster thrash?

A closed loop of `streams` clients, each sending its next streamed completion as soon as
the last one ended, for `seconds`. A planner that keeps up with a steady load scales up
early and then holds still; the figures are the scale-ups and releases after `settle_s`.
Prints JSON.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from blitzscale.bench.soak import PROMPTS
from blitzscale.serve.background import BackgroundService
from blitzscale.serve.config import ServeConfig
from blitzscale.serve.events import ScaleEvent


@dataclass(frozen=True)
class SteadyConfig:
    streams: int = 16
    seconds: float = 60.0
    settle_s: float = 10.0  # scale events before this are the cluster finding its size
    workers: int = 4
    mode: str = "pd"
    policy: str = "blitz"
    max_tokens: int = 32
    prompt_words: int = 0  # 0: the short prompts; else each prompt is padded to about this many words
    reload_cost_factor: float | None = None  # None: the planner's default (0: the old rule)


async def _client(url: str, cfg: SteadyConfig, k: int, t_end: float, done: list[str]) -> None:
    body = {"max_tokens": cfg.max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=300) as client:
        i = k
        while time.monotonic() < t_end:
            prompt = _prompt(i, cfg.prompt_words)
            failed = False
            async with client.stream("POST", f"{url}/v1/completions", json={**body, "prompt": prompt}) as r:
                async for line in r.aiter_lines():
                    failed |= line.startswith("data:") and '"error"' in line  # a stream's error event
            done.append("stream_error" if failed else str(r.status_code))
            i += cfg.streams


def _prompt(i: int, words: int) -> str:
    """Prompt i, padded with context (other prompts, in turn) to about `words` words."""
    prompt = PROMPTS[i % len(PROMPTS)]
    context: list[str] = []
    j = i + 1
    while words and len(" ".join(context).split()) + len(prompt.split()) < words:
        context.append(PROMPTS[j % len(PROMPTS)])
        j += 1
    return "\n".join([*context, prompt])


def run_steady(cfg: SteadyConfig) -> dict[str, Any]:
    planner = {} if cfg.reload_cost_factor is None else {"reload_cost_factor": cfg.reload_cost_factor}
    serve = ServeConfig().with_overrides(
        cluster={"num_workers": cfg.workers},
        router={"mode": cfg.mode},
        policy={"name": cfg.policy},
        planner=planner,
    )
    with BackgroundService(serve) as svc:
        scaler = svc.service.scaler
        assert scaler is not None
        t0 = time.monotonic()
        done: list[str] = []

        async def load() -> None:
            t_end = time.monotonic() + cfg.seconds
            await asyncio.gather(*(_client(svc.url, cfg, k, t_end, done) for k in range(cfg.streams)))

        asyncio.run(load())
        t_end = time.monotonic()  # the last streams end after `seconds`; what follows is not load
        events = [e for e in scaler.events if t0 <= e.time <= t_end]
        late = [e for e in events if e.time - t0 >= cfg.settle_s]
        return {
            "config": asdict(cfg),
            "load_s": round(t_end - t0, 1),
            "requests": len(done),
            "requests_ok": sum(1 for s in done if s == "200"),
            "requests_failed": dict(Counter(s for s in done if s != "200")),
            "scale_ups": sum(1 for e in events if e.is_up),
            "releases": sum(1 for e in events if e.direction == "down"),
            "scale_ups_after_settle": sum(1 for e in late if e.is_up),
            "releases_after_settle": sum(1 for e in late if e.direction == "down"),
            "events": [_event(e, t0) for e in events],
        }


def _event(e: ScaleEvent, t0: float) -> dict[str, Any]:
    at = round(e.time - t0, 2)
    return {"at_s": at, "direction": e.direction, "path": e.path, "ranks": list(e.ranks)}
