"""`bench serve`'s mixes through the HTTP API of a running server: streamed completions
with token-id prompts (random-weight models have no tokenizer), `ignore_eos`, greedy. With
no stop string each streamed chunk carries one step's token, so chunks count tokens."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import httpx

from blitzscale.bench.mixes import Burst, ClosedLoop, Mix, Single, median


@dataclass
class Answer:
    status: int
    sent: float
    stamps: list[float] = field(default_factory=list)  # one per token-bearing chunk
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error and bool(self.stamps)


class HttpLoad:
    def __init__(self, url: str, model: str, vocab: int, connections: int) -> None:
        self.url = url
        self.model = model
        self.vocab = vocab
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits)
        self.rng = random.Random(0)

    async def close(self) -> None:
        await self.client.aclose()

    def prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(self.vocab) for _ in range(n)]

    async def ask(self, prompt: list[int], max_tokens: int) -> Answer:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        a = Answer(0, time.perf_counter())
        try:
            async with self.client.stream("POST", f"{self.url}/v1/completions", json=body) as r:
                a.status = r.status_code
                async for line in r.aiter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if "error" in chunk:
                        a.error = str(chunk["error"])
                    elif chunk.get("choices"):
                        a.stamps.append(time.perf_counter())
        except httpx.HTTPError as e:
            a.error = f"{type(e).__name__}: {e}"
        return a

    async def closed_loop(self, mix: Mix, streams: int) -> ClosedLoop:
        t0 = time.perf_counter()
        start, end = t0 + mix.warmup_s, t0 + mix.warmup_s + mix.window_s
        answers: list[Answer] = []
        prompts = [self.prompt(mix.prompt_len) for _ in range(streams * 4)]

        async def client(k: int) -> None:
            i = k
            while time.perf_counter() < end:
                answers.append(await self.ask(prompts[i % len(prompts)], mix.max_tokens))
                i += streams

        await asyncio.gather(*(client(k) for k in range(streams)))
        tokens = sum(1 for a in answers for t in a.stamps if start <= t < end)
        done = sum(1 for a in answers if a.ok and start <= a.stamps[-1] < end)
        errors = sum(1 for a in answers if not a.ok)
        return ClosedLoop(streams, round(tokens / mix.window_s, 1), done, errors)

    async def burst(self, mix: Mix) -> Burst:
        prompts = [self.prompt(mix.burst_len) for _ in range(mix.burst)]
        t0 = time.perf_counter()
        answers = await asyncio.gather(*(self.ask(p, 1) for p in prompts))
        ok = [a.stamps[-1] - t0 for a in answers if a.ok]
        refused = sum(1 for a in answers if a.status == 429)
        return Burst(
            requests=mix.burst,
            refused=refused,
            errors=len(answers) - len(ok) - refused,
            last_answer_s=round(max(ok), 4) if ok else float("nan"),
            ttft_p50_s=round(median(ok), 4),
        )

    async def single(self, mix: Mix) -> Single:
        ttfts = []
        for _ in range(mix.single_runs):
            a = await self.ask(self.prompt(mix.single_len), 1)
            if a.ok:
                ttfts.append(a.stamps[0] - a.sent)
        a = await self.ask(self.prompt(mix.prompt_len), mix.stream_tokens)
        s = a.stamps
        interval = (s[-1] - s[0]) / (len(s) - 1) if len(s) > 1 else float("nan")
        return Single(mix.single_len, round(median(ttfts), 5), round(interval, 6))
