"""Open-loop replay: send each request at its timestamp, however far behind the server is.

A closed-loop client (send the next request when one finishes) lets a slow server slow the
load down and hides exactly the queueing that autoscaling exists to remove. So one
dispatcher sleeps until each request's absolute time on the replay clock and starts a task
for it; the tasks never block the dispatcher. The HTTP client has no connection limit for
the same reason: a pool limit would queue requests inside the client.
"""

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from blitzscale.client.protocols import PROTOCOLS, parse_event, request_for, sse_data
from blitzscale.client.record import STATUS_ERROR, STATUS_OK, RequestRecord
from blitzscale.client.traces import MOONCAKE_BLOCK_TOKENS, TraceRequest


@dataclass(frozen=True)
class ReplayConfig:
    """Where and how to send. `url` is the server root (`http://host:port`); `timeout_s`
    bounds each request from send to last byte."""

    url: str
    protocol: str = "openai"
    model: str | None = None
    api_key: str | None = None
    timeout_s: float = 300.0
    show_progress: bool = True
    token_ids: bool = False  # prompts as token ids (openai; models without a tokenizer)
    # Tokens per prefix block of requests with hash_ids (protocols.hashed_prompt).
    hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}; expected one of {', '.join(PROTOCOLS)}")
        if self.token_ids and self.protocol != "openai":
            raise ValueError(f"token-id prompts need the openai protocol, not {self.protocol!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout must be > 0 s, got {self.timeout_s}")
        if self.hash_block_tokens < 1:
            raise ValueError(f"hash_block_tokens must be >= 1, got {self.hash_block_tokens}")


@dataclass
class _Stream:
    """What one request has received so far; owned by that request's task alone."""

    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    queue_s: float | None = None
    inference_s: float | None = None


def run(requests: Sequence[TraceRequest], config: ReplayConfig) -> list[RequestRecord]:
    """Replay from synchronous code (the CLI); returns one record per request, in order."""
    return asyncio.run(replay(requests, config))


async def replay(requests: Sequence[TraceRequest], config: ReplayConfig) -> list[RequestRecord]:
    """Send every request at `arrival_s` after the start and wait for all of them."""
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        base_url=config.url, headers=headers, limits=limits, timeout=config.timeout_s
    ) as client:
        with _progress(config.show_progress, len(requests)) as on_done:
            start = time.perf_counter()
            tasks = []
            for index, request in enumerate(requests):
                delay = start + request.arrival_s - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(_send(client, config, index, request, start))
                task.add_done_callback(on_done)
                tasks.append(task)
            return list(await asyncio.gather(*tasks))


async def _send(
    client: httpx.AsyncClient, config: ReplayConfig, index: int, request: TraceRequest, start: float
) -> RequestRecord:
    """One request, start to finish; every failure becomes an error record, never an exception."""
    path, body = request_for(
        config.protocol,
        config.model,
        request.input_tokens,
        request.output_tokens,
        token_ids=config.token_ids,
        salt=index,
        hash_ids=request.hash_ids,
        block_tokens=config.hash_block_tokens,
    )
    stream = _Stream()
    sent = time.perf_counter()
    try:
        async with asyncio.timeout(config.timeout_s), client.stream("POST", path, json=body) as response:
            stream.queue_s = _header_seconds(response.headers, "x-queue-time")
            stream.inference_s = _header_seconds(response.headers, "x-inference-time")
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:200]
                raise _RequestFailed(f"HTTP {response.status_code}: {text}")
            await _read_stream(response, config.protocol, stream)
        error = None if stream.token_times else "stream ended with no tokens"
    except TimeoutError:
        error = f"timeout after {config.timeout_s:g} s"
    except _RequestFailed as e:
        error = str(e)
    except httpx.HTTPError as e:
        error = f"{type(e).__name__}: {e}"
    except Exception as e:  # anything else still fails only this request, not the whole run
        error = f"unexpected {type(e).__name__}: {e}"
    return _record(index, request, start, sent, time.perf_counter(), stream, error)


def _record(
    index: int,
    request: TraceRequest,
    start: float,
    sent: float,
    end: float,
    stream: _Stream,
    error: str | None,
) -> RequestRecord:
    """Latencies only for a request that completed: a cut-off stream would bias TTFT and TBT."""
    times = stream.token_times
    common = {
        "index": index,
        "scheduled_s": request.arrival_s,
        "send_s": sent - start,
        "input_tokens": stream.prompt_tokens or request.input_tokens,
        "requested_output_tokens": max(1, request.output_tokens),  # (as request_for asks)
        "queue_s": stream.queue_s,
        "inference_s": stream.inference_s,
    }
    if error is not None:
        return RequestRecord(**common, output_tokens=len(times), status=STATUS_ERROR, error=error)
    return RequestRecord(
        **common,
        output_tokens=stream.completion_tokens or len(times),
        status=STATUS_OK,
        ttft_s=times[0] - sent,
        tbts_s=tuple(b - a for a, b in itertools.pairwise(times)),
        e2e_s=end - sent,
    )


def _header_seconds(headers: httpx.Headers, name: str) -> float | None:
    """A timing header in milliseconds (TGI's convention), as seconds; None if absent or bad."""
    try:
        return float(headers[name]) / 1000.0
    except (KeyError, ValueError):
        return None


class _RequestFailed(Exception):
    """The server answered, but with an error (HTTP status or an error event)."""


async def _read_stream(response: httpx.Response, protocol: str, stream: _Stream) -> None:
    async for line in response.aiter_lines():
        data = sse_data(line)
        if data is None:
            continue
        now = time.perf_counter()
        event = parse_event(protocol, data)
        if event.error is not None:
            raise _RequestFailed(event.error)
        if event.is_token:
            stream.token_times.append(now)
        stream.prompt_tokens = event.prompt_tokens or stream.prompt_tokens
        stream.completion_tokens = event.completion_tokens or stream.completion_tokens
        if event.is_done and protocol == "openai":
            return


@contextmanager
def _progress(enabled: bool, total: int) -> Iterator[Callable[[asyncio.Task], None]]:
    """A rich progress bar of finished requests; yields the done-callback that advances it."""
    if not enabled:
        yield lambda _task: None
        return
    columns = (TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns) as progress:
        bar = progress.add_task("replay", total=total)
        yield lambda _task: progress.advance(bar)
