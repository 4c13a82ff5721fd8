"""Load shedding and health: a full queue refuses new work with 429 and Retry-After, a
request that waited too long is refused the same way, and /health says 503 when nothing
can serve. One colocated instance that takes one request at a time."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from blitzscale.core.sampling import SamplingParams
from blitzscale.messages import GenerateMsg, Message
from blitzscale.serve.background import LoopThread
from blitzscale.serve.server import ServingCluster
from tests.serve.conftest import make_service, start_http, stop_http

WAIT_S = 120

one_at_a_time = pytest.fixture(scope="module")(
    make_service(
        cluster={"num_workers": 1},
        router={
            "mode": "colocated",
            "max_requests_per_instance": 1,
            "max_queue_tokens": 40,
            "max_queue_wait_s": 0.5,
        },
        policy={"name": "fixed", "fixed_prefill": 1},
    )
)


@pytest.fixture(scope="module")
def url(one_at_a_time: tuple[ServingCluster, LoopThread]) -> Iterator[str]:
    u, server = start_http(*one_at_a_time)
    yield u
    stop_http(server, one_at_a_time[1])


def _until(cond, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_full_queue_and_a_long_wait_get_429_and_nothing_serving_gets_503(
    one_at_a_time: tuple[ServingCluster, LoopThread], url: str
) -> None:
    service, _lt = one_at_a_time
    router, cluster = service.router, service.cluster
    assert router is not None and cluster is not None
    assert httpx.get(f"{url}/health", timeout=WAIT_S).status_code == 200
    long_body = {"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}
    results: dict[str, httpx.Response] = {}

    def post(name: str, body: dict) -> None:
        results[name] = httpx.post(f"{url}/v1/completions", json=body, timeout=WAIT_S)

    long = threading.Thread(target=post, args=("long", long_body))
    long.start()
    _until(lambda: router.reqs and not router.queue, "the long request to be dispatched")
    waiting = threading.Thread(target=post, args=("late", {"prompt": "Hello there", "max_tokens": 4}))
    waiting.start()
    _until(lambda: len(router.queue) == 1, "a request to queue behind it")
    big = httpx.post(f"{url}/v1/completions", json={"prompt": "word " * 60, "max_tokens": 4}, timeout=WAIT_S)
    assert big.status_code == 429, big.text
    assert int(big.headers["retry-after"]) >= 1
    assert "prompt tokens are queued" in big.json()["error"]["message"]
    waiting.join(WAIT_S)
    late = results["late"]
    assert late.status_code == 429, late.text
    assert "waited" in late.json()["error"]["message"] and late.headers["retry-after"]
    assert router.num_refused == {"queue_full": 1, "queue_timeout": 1}
    metrics = httpx.get(f"{url}/metrics", timeout=WAIT_S).text
    assert 'blitzscale_requests_refused_total{reason="queue_full"} 1.0' in metrics

    cluster.procs[0].kill()
    _until(lambda: httpx.get(f"{url}/health", timeout=WAIT_S).status_code == 503, "/health to say 503")
    body = httpx.get(f"{url}/health", timeout=WAIT_S).json()
    assert body["status"] == "degraded" and body["problems"]
    long.join(WAIT_S)
    # Not streamed, so its client had seen nothing: it ran again rather than failing. With
    # nothing serving it waits past max_queue_wait_s and is refused (429); if the respawned
    # worker serves first, it completes.
    done = results["long"]
    if done.status_code == 429:
        assert "waited" in done.json()["error"]["message"], done.text
        assert router.num_refused["queue_timeout"] == 2
    else:
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 1500, done.text


def test_a_body_over_the_limit_gets_413_by_length_or_by_chunks(url: str) -> None:
    big = {"prompt": "x" * (3 << 20), "max_tokens": 1}
    r = httpx.post(f"{url}/v1/completions", json=big, timeout=WAIT_S)
    assert r.status_code == 413 and "too large" in r.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(40):
            yield b"y" * (100 << 10)
        yield b'", "max_tokens": 1}'

    r = httpx.post(f"{url}/v1/completions", content=chunks(), timeout=WAIT_S)
    assert r.status_code == 413
    assert httpx.get(f"{url}/health", timeout=WAIT_S).status_code in (200, 503)


decode_bound = pytest.fixture(scope="module")(
    make_service(
        cluster={"num_workers": 2},
        router={"mode": "pd", "max_requests_per_instance": 2, "max_pending_migrations": 1},
        policy={"name": "fixed", "fixed_prefill": 1, "fixed_decode": 1},
    )
)


def test_prompts_wait_in_the_queue_while_decode_is_the_bottleneck(
    decode_bound: tuple[ServingCluster, LoopThread],
) -> None:
    """One decode instance takes two requests; while a prefilled request waits for it, no
    new prompt is prefilled: prompts wait in the queue (where shedding applies), and every
    request still completes with the right answer."""
    service, lt = decode_bound
    router = service.router
    assert router is not None
    ids = router.encode("Once upon a time")
    waiting_at_dispatch: list[int] = []  # prefilled requests waiting when a prompt was sent
    send = router._send

    async def watched(rank: int, msg: Message) -> None:
        if isinstance(msg, GenerateMsg):
            waiting_at_dispatch.append(len(router.pending_migrations))
        await send(rank, msg)

    async def one(i: int) -> list[int]:
        out: list[int] = []
        params = SamplingParams(max_tokens=16 + 8 * i, temperature=0, ignore_eos=True)  # end one by one
        async for o in router.generate(f"r{i}", ids, params):
            out += o.new_token_ids
        return out

    async def scenario() -> list[list[int]]:
        return await asyncio.gather(*(one(i) for i in range(8)))

    router._send = watched  # type: ignore[method-assign]
    try:
        outs = lt.run(scenario(), timeout=WAIT_S * 3)
    finally:
        del router._send
    assert len(waiting_at_dispatch) == 8
    assert max(waiting_at_dispatch) == 0, waiting_at_dispatch
    longest = outs[-1]
    assert all(o == longest[: 16 + 8 * i] for i, o in enumerate(outs))  # greedy: prefixes of one answer
