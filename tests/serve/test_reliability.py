"""A hostile or unlucky client never gets a wrong answer, never hangs, never wedges the
cluster (pd mode, CPU workers, one prefill and one decode instance that never scale)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from blitzscale.core.sampling import SamplingParams
from blitzscale.errors import InvalidRequestError
from blitzscale.serve.background import LoopThread
from blitzscale.serve.server import ServingCluster
from tests.serve.conftest import make_service

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a dragon"]
WAIT_S = 120  # generous: a loaded 2-core machine is slow, a hang is not

fixed_pd = pytest.fixture(scope="module")(
    make_service(
        cluster={"num_workers": 2},
        router={"mode": "pd"},
        policy={"name": "fixed", "fixed_prefill": 1, "fixed_decode": 1},
    )
)


@pytest.fixture(scope="module")
def reference(fixed_pd: tuple[ServingCluster, LoopThread]) -> list[str]:
    """Greedy texts of PROMPTS on the cluster before anything went wrong."""
    service, lt = fixed_pd
    return lt.run(asyncio.wait_for(_texts(service, PROMPTS), WAIT_S))


async def _run(service: ServingCluster, rid: str, prompt: str, params: SamplingParams) -> str:
    router = service.router
    assert router is not None
    text = ""
    async for o in router.generate(rid, router.encode(prompt), params):
        text = o.text
    return text


async def _texts(service: ServingCluster, prompts: list[str], tag: str = "ref") -> list[str]:
    params = SamplingParams(max_tokens=12, temperature=0)
    return [await _run(service, f"{tag}-{i}", p, params) for i, p in enumerate(prompts)]


def _idle(service: ServingCluster) -> Any:
    async def wait() -> None:
        router = service.router
        assert router is not None
        while router.reqs or any(
            i.stats is not None and i.stats.used_blocks for i in router.instances.values()
        ):
            await asyncio.sleep(0.05)

    return asyncio.wait_for(wait(), WAIT_S)


def test_a_client_that_leaves_during_the_kv_hand_off_does_not_corrupt_later_answers(
    fixed_pd: tuple[ServingCluster, LoopThread], reference: list[str]
) -> None:
    service, lt = fixed_pd
    router = service.router
    assert router is not None

    async def leave_after_first_chunk(rid: str) -> None:
        params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
        stream = router.generate(rid, router.encode("Tell me a long story about the sea."), params)
        async for _first in stream:  # the prefill's token: the KV hand-off starts right now
            break
        await stream.aclose()  # the client is gone

    async def scenario() -> list[list[str]]:
        rounds = []
        for k in range(3):
            await leave_after_first_chunk(f"gone-{k}")
            rounds.append(await asyncio.wait_for(_texts(service, PROMPTS, f"after-{k}"), WAIT_S))
        await _idle(service)
        return rounds

    for texts in lt.run(scenario()):
        assert texts == reference


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": float("nan")}, "top_p"),
        ({"max_tokens": 2**64}, "max_tokens"),
        ({"seed": 2**70}, "seed"),
        ({"seed": -1}, "seed"),
        ({"top_k": 2**64}, "top_k"),
        ({"stop_token_ids": (2**64,)}, "stop_token_ids"),
    ],
)
def test_values_that_cannot_run_are_refused_before_any_worker_sees_them(
    fixed_pd: tuple[ServingCluster, LoopThread], params: dict[str, Any], needle: str
) -> None:
    service, lt = fixed_pd
    p = SamplingParams(**{"max_tokens": 4, **params})
    with pytest.raises(InvalidRequestError, match=needle):
        lt.run(asyncio.wait_for(_run(service, f"bad-{needle}", PROMPTS[0], p), WAIT_S))
    assert service.router is not None and not service.router.reqs


def test_tiny_temperatures_sample_and_a_request_that_breaks_a_step_fails_alone(
    fixed_pd: tuple[ServingCluster, LoopThread], reference: list[str]
) -> None:
    """A positive temperature too small to divide by samples like greedy; a request the
    engine cannot sample fails with an error, and the worker goes on serving."""
    service, lt = fixed_pd
    cluster = service.cluster
    assert cluster is not None
    alive = cluster.alive_ranks()

    async def scenario() -> tuple[str, list[str]]:
        tiny = await _run(service, "tiny-t", PROMPTS[0], SamplingParams(max_tokens=12, temperature=1e-40))
        return tiny, await asyncio.wait_for(_texts(service, PROMPTS, "after-tiny"), WAIT_S)

    tiny, texts = lt.run(asyncio.wait_for(scenario(), WAIT_S))
    assert tiny == reference[0]
    assert texts == reference
    assert cluster.alive_ranks() == alive


@pytest.fixture(autouse=True)
def _no_leaks(fixed_pd: tuple[ServingCluster, LoopThread]) -> Iterator[None]:
    yield
    service, lt = fixed_pd
    lt.run(_idle(service))


def test_foreign_frames_on_the_data_socket_do_not_stop_the_router(
    fixed_pd: tuple[ServingCluster, LoopThread], reference: list[str]
) -> None:
    import zmq

    from blitzscale.messages import OutputMsg, OutputsMsg, encode

    service, lt = fixed_pd
    router = service.router
    assert router is not None
    endpoint = router.data.sock.getsockopt(zmq.LAST_ENDPOINT).decode()  # type: ignore[attr-defined]
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 1000)
    s.connect(endpoint)
    out = OutputMsg(
        request_id="ref-0",
        new_token_ids=[1],
        text_delta="forged",
        finished=True,
        finish_reason="stop",
        num_prompt_tokens=1,
        num_output_tokens=1,
    )
    for frames in ([b"a", b"b"], [b"garbage"], [encode(OutputsMsg(rank=0, outputs=[out]))]):
        s.send_multipart(frames)
    s.close()
    ctx.term()
    assert lt.run(asyncio.wait_for(_texts(service, PROMPTS), WAIT_S)) == reference


def test_integers_no_message_can_carry_get_a_400_over_http(
    fixed_pd: tuple[ServingCluster, LoopThread],
) -> None:
    import httpx

    from tests.serve.conftest import start_http, stop_http

    service, lt = fixed_pd
    url, server = start_http(service, lt)
    try:
        bodies = [
            ("/v1/completions", {"prompt": "hi", "max_tokens": 2**64}, "max_tokens"),
            ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "seed": 2**64}, "seed"),
            ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "top_k": 2**64}, "top_k"),
            (
                "/v1/completions",
                {"prompt": "hi", "max_tokens": 2, "stop_token_ids": [2**64]},
                "stop_token_ids",
            ),
            ("/generate", {"inputs": "hi", "parameters": {"seed": 2**70, "max_new_tokens": 2}}, "seed"),
        ]
        for path, body, needle in bodies:
            r = httpx.post(url + path, json=body, timeout=WAIT_S)
            assert r.status_code == (422 if path == "/generate" else 400), (body, r.text)  # (TGI's)
            err = r.json()["error"]  # OpenAI's {"error": {...}}; TGI's {"error": text, "error_type"}
            assert needle in (err["message"] if isinstance(err, dict) else err)
    finally:
        stop_http(server, lt)
