"""`bench serve`'s mixes through the HTTP API of a running server: streamed completions
with token-id prompts (random-weight models have no tokenizer), `ignore_eos`, greedy. With
no stop string each streamed chunk carries one step's token, so chunks count tokens."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
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


STREAMS_PER_PROCESS = 32  # closed-loop clients one client process drives


@dataclass(frozen=True)
class WindowCounts:
    tokens: int
    done: int
    errors: int

    @staticmethod
    def sum(parts: Iterable[WindowCounts]) -> WindowCounts:
        ps = list(parts)
        return WindowCounts(sum(p.tokens for p in ps), sum(p.done for p in ps), sum(p.errors for p in ps))


def _count_in_process(spec_json: str) -> str:
    """A client process's share of a closed loop (JSON in and out: plain values only)."""
    url, model, vocab, prompt_len, max_tokens, streams, start, end, clients = json.loads(spec_json)
    mix = Mix(prompt_len=prompt_len, max_tokens=max_tokens)

    async def run() -> WindowCounts:
        load = HttpLoad(url, model, vocab, len(clients) + 4, seed=1 + clients[0])
        try:
            return await load.count_window(mix, clients, streams, (start, end))
        finally:
            await load.close()

    c = asyncio.run(run())
    return json.dumps([c.tokens, c.done, c.errors])


class HttpLoad:
    def __init__(self, url: str, model: str, vocab: int, connections: int, seed: int = 0) -> None:
        self.url = url
        self.model = model
        self.vocab = vocab
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits)
        # a fresh prompt for every request, and client processes seeded apart: no two requests
        # share a cached prefix, as in the engine-alone run they are compared with
        self.rng = random.Random(seed)

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
        """`streams` clients in a loop; over STREAMS_PER_PROCESS of them are spread over
        client processes of their own, so that the client's parsing of thousands of
        streamed chunks a second is not what the mix measures."""
        t0 = time.perf_counter()  # (CLOCK_MONOTONIC: the same clock in every process)
        window = (t0 + mix.warmup_s, t0 + mix.warmup_s + mix.window_s)
        procs = -(-streams // STREAMS_PER_PROCESS)
        if procs == 1:
            counts = await self.count_window(mix, range(streams), streams, window)
        else:
            spec = [self.url, self.model, self.vocab, mix.prompt_len, mix.max_tokens, streams, *window]
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(procs, mp_context=ctx) as pool:
                loop = asyncio.get_running_loop()
                parts = [range(k, streams, procs) for k in range(procs)]
                specs = [json.dumps([*spec, list(p)]) for p in parts]
                jobs = [loop.run_in_executor(pool, _count_in_process, one) for one in specs]
                counts = WindowCounts.sum(WindowCounts(*json.loads(r)) for r in await asyncio.gather(*jobs))
        return ClosedLoop(streams, round(counts.tokens / mix.window_s, 1), counts.done, counts.errors)

    async def count_window(
        self, mix: Mix, clients: range | list[int], streams: int, window: tuple[float, float]
    ) -> WindowCounts:
        """Run the given clients of a `streams`-client closed loop until the window ends;
        tokens and answers inside the window, and failed answers."""
        start, end = window
        answers: list[Answer] = []

        async def client(k: int) -> None:
            max_tokens = mix.first_tokens(k, streams)
            while time.perf_counter() < end:
                answers.append(await self.ask(self.prompt(mix.prompt_len), max_tokens))
                max_tokens = mix.max_tokens

        await asyncio.gather(*(client(k) for k in clients))
        tokens = sum(1 for a in answers for t in a.stamps if start <= t < end)
        done = sum(1 for a in answers if a.ok and start <= a.stamps[-1] < end)
        errors = sum(1 for a in answers if not a.ok)
        return WindowCounts(tokens, done, errors)

    async def burst(self, mix: Mix) -> Burst:
        prompts = [self.prompt(mix.burst_len) for _ in range(mix.burst)]
        t0 = time.perf_counter()
        answers = await asyncio.gather(*(self.ask(p, 1) for p in prompts))
        ok = [a.stamps[-1] - t0 for a in answers if a.ok]
        return Burst.of(mix.burst, ok, refused=sum(1 for a in answers if a.status == 429))

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
