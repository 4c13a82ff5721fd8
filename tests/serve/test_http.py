"""The serving cluster through its HTTP API, as a user runs it: the official openai client,
pd mode against colocated mode against a local engine, and bad input."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from blitzscale.core.sampling import SamplingParams
from blitzscale.errors import RequestFailedError
from blitzscale.serve.background import LoopThread
from blitzscale.serve.server import ServingCluster
from tests.serve.conftest import start_http, stop_http

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a dragon"]
CHAT = [{"role": "user", "content": "What is the tallest mountain on Earth?"}]


@pytest.fixture(scope="module")
def colocated_url(colocated_service: tuple[ServingCluster, LoopThread]) -> Iterator[str]:
    url, server = start_http(*colocated_service)
    yield url
    stop_http(server, colocated_service[1])


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _completions(url: str) -> list[str]:
    c = _client(url)
    return [
        c.completions.create(model="smollm2-135m", prompt=p, max_tokens=16, temperature=0).choices[0].text
        for p in PROMPTS
    ]


def test_openai_client_chat_and_completions_streaming_and_not(pd_url: str, smollm2_engine_texts) -> None:
    c = _client(pd_url)
    done = c.completions.create(model="smollm2-135m", prompt=PROMPTS[0], max_tokens=16, temperature=0)
    assert done.choices[0].text == smollm2_engine_texts[0]
    assert done.usage.completion_tokens == 16 and done.usage.prompt_tokens == 5
    streamed = c.completions.create(
        model="smollm2-135m", prompt=PROMPTS[0], max_tokens=16, temperature=0, stream=True
    )
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == done.choices[0].text
    chat = c.chat.completions.create(model="smollm2-135m", messages=CHAT, max_tokens=24, temperature=0)
    text = chat.choices[0].message.content
    assert "Everest" in text
    chunks = c.chat.completions.create(
        model="smollm2-135m", messages=CHAT, max_tokens=24, temperature=0, stream=True
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == text
    assert [m.id for m in c.models.list()] == ["smollm2-135m"]


def test_the_readmes_python_example_runs_as_written(pd_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """README.md's OpenAI example, its address the test server's, prints an answer."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert 'base_url="http://127.0.0.1:8000/v1"' in code
    exec(code.replace("http://127.0.0.1:8000", pd_url), {})  # (our own README)
    assert capsys.readouterr().out.strip()


def test_pd_mode_with_kv_migration_equals_colocated_and_the_engine(
    pd_url: str, colocated_url: str, smollm2_engine_texts: list[str]
) -> None:
    assert _completions(pd_url) == _completions(colocated_url) == smollm2_engine_texts


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, ""),
        (b'{"model": "gpt-4", "prompt": "hi"}', 404, "gpt-4"),
        (b'{"prompt": "hi", "max_tokens": -3}', 400, "max_tokens"),
        (b'{"prompt": "' + b"word " * 9000 + b'", "max_tokens": 4}', 400, "context"),
        (b'{"prompt": "", "max_tokens": 4}', 400, "empty"),
    ],
)
def test_bad_input_gets_its_4xx_and_the_server_keeps_serving(
    pd_url: str, body: bytes, status: int, needle: str, smollm2_engine_texts: list[str]
) -> None:
    r = httpx.post(f"{pd_url}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]
    assert _completions(pd_url)[0] == smollm2_engine_texts[0]


def test_wrong_api_key_is_401(pd_service: tuple[ServingCluster, LoopThread]) -> None:
    url, server = start_http(*pd_service, api_key="secret")
    try:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi"}, headers={"Authorization": "Bearer no"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        ok = openai.OpenAI(base_url=f"{url}/v1", api_key="secret", max_retries=0).completions.create(
            model="smollm2-135m", prompt="Hi", max_tokens=2
        )
        assert len(ok.choices[0].text) > 0
    finally:
        stop_http(server, pd_service[1])


def test_metrics_expose_instances_queue_and_latency(pd_url: str) -> None:
    _completions(pd_url)
    text = httpx.get(f"{pd_url}/metrics").text
    for name in (
        "blitzscale_instances{",
        "blitzscale_queue_requests",
        "blitzscale_scale_events_total",
        "blitzscale_transfer_bytes_total",
        "blitzscale_ttft_seconds_bucket",
        "blitzscale_tbt_seconds_bucket",
    ):
        assert name in text, name
    # device memory per model: its weights and its serving instances' KV caches
    kv = [ln for ln in text.splitlines() if ln.startswith("blitzscale_model_kv_cache_bytes{")]
    assert kv and all(float(ln.split()[-1]) > 0 for ln in kv), kv


def test_client_disconnect_aborts_and_frees_blocks(
    pd_url: str, pd_service: tuple[ServingCluster, LoopThread]
) -> None:
    import time

    service, _ = pd_service
    assert service.router is not None
    body = {
        "prompt": PROMPTS[2],
        "max_tokens": 1500,  # over a minute unless aborted
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{pd_url}/v1/completions", json=body, timeout=60) as r:
        for n, _line in enumerate(r.iter_lines()):
            if n > 6:
                break  # leave mid-stream
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        stats = [i.stats for i in service.router.instances.values() if i.stats is not None]
        if (
            not service.router.reqs
            and stats
            and all(s.used_blocks == 0 and s.num_running == 0 for s in stats)
        ):
            break
        time.sleep(0.1)
    assert not service.router.reqs
    assert all(i.stats.used_blocks == 0 for i in service.router.instances.values() if i.stats is not None)


def _prefix_hits(url: str, name: str = "blitzscale_prefix_cache_hits") -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    fam = fams.get(name)
    return sum(s.value for s in fam.samples if s.name.endswith("_total")) if fam else 0.0


ROUTED = "blitzscale_router_prefix_routed_requests"


def test_a_repeated_long_prompt_hits_the_prefix_cache_and_reset_forgets_it(pd_url: str) -> None:
    import time

    c = _client(pd_url)
    prompt = " ".join(f"Step {i}: check the queue, the KV usage and the scale events." for i in range(12))
    before, routed = _prefix_hits(pd_url), _prefix_hits(pd_url, ROUTED)
    texts = [
        c.completions.create(model="smollm2-135m", prompt=prompt, max_tokens=6, temperature=0).choices[0].text
        for _ in range(2)
    ]
    assert texts[0] == texts[1]
    deadline = time.monotonic() + 120  # the workers' stats come every few seconds
    while _prefix_hits(pd_url) - before < 64 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _prefix_hits(pd_url) - before >= 64  # the second prefill took the first's blocks
    assert _prefix_hits(pd_url, ROUTED) - routed == 1  # the router sent it where the first went
    r = httpx.post(f"{pd_url}/reset_prefix_cache", timeout=30)
    assert r.status_code == 200 and r.json()["instances"] >= 1
    again = c.completions.create(model="smollm2-135m", prompt=prompt, max_tokens=6, temperature=0)
    assert again.choices[0].text == texts[0]
    assert _prefix_hits(pd_url, ROUTED) - routed == 1  # after the reset the router expected nothing


def test_a_request_that_cannot_be_sent_fails_alone_and_the_queue_goes_on(
    pd_service: tuple[ServingCluster, LoopThread],
) -> None:
    """A stop string holding a lone surrogate cannot be encoded for the workers (the HTTP
    API refuses such text first; the router's other callers need not). That request fails
    with its reason; it is not left assigned and unsent, blocking the instance."""
    service, lt = pd_service
    router = service.router
    assert router is not None
    ids = router.encode("Once upon a time")

    async def run(stop: tuple[str, ...]) -> list[int]:
        out: list[int] = []
        params = SamplingParams(max_tokens=2, temperature=0, stop=stop, ignore_eos=True)
        async for o in router.generate(f"unsendable-{len(stop)}", ids, params):
            out += o.new_token_ids
        return out

    with pytest.raises(RequestFailedError, match="could not be sent"):
        lt.run(run(("\ud800",)), timeout=120)
    assert len(lt.run(run(()), timeout=120)) == 2
    assert not router.reqs
