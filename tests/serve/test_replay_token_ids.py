"""The replay client against our server with a random-weight model, which has no tokenizer:
prompts sent as token ids are served with every token timed; text prompts are refused with
a message that says what to send instead."""

from __future__ import annotations

import asyncio
import dataclasses

from blitzscale.client.replay import ReplayConfig, replay
from blitzscale.client.traces import TraceRequest
from blitzscale.serve.config import ServeConfig
from tests.serve.conftest import running, start_http, stop_http

MODEL = "random:tiny-llama3"


def test_token_id_prompts_replay_against_a_model_without_a_tokenizer(tmp_path) -> None:
    cfg = ServeConfig().with_overrides(
        model={"name": MODEL, "cache_dir": str(tmp_path)},
        cluster={"num_workers": 1},
        router={"mode": "colocated"},
        policy={"name": "fixed"},
    )
    requests = [TraceRequest(0.0, 40, 6), TraceRequest(0.05, 9, 1), TraceRequest(0.1, 70, 12)]
    with running(cfg) as (service, lt):
        url, server = start_http(service, lt)
        try:
            as_ids = ReplayConfig(url=url, show_progress=False, token_ids=True, timeout_s=120)
            ok = asyncio.run(replay(requests, as_ids))
            as_text = asyncio.run(replay(requests[:1], ReplayConfig(url=url, show_progress=False)))
        finally:
            stop_http(server, lt)
    assert [r.status for r in ok] == ["ok"] * 3, [r.error for r in ok]
    assert [r.input_tokens for r in ok] == [40, 9, 70]
    assert [r.output_tokens for r in ok] == [6, 1, 12]
    # every token arrived as its own event: one gap between each two of them
    assert [len(r.tbts_s) for r in ok] == [5, 0, 11]
    assert all(r.ttft_s is not None and r.ttft_s > 0 for r in ok)
    [refused] = as_text
    assert refused.status == "error" and "HTTP 400" in refused.error and "send token ids" in refused.error


def test_hash_id_prompts_share_exactly_their_common_blocks_in_the_prefix_cache(tmp_path) -> None:
    """Two Mooncake-style requests whose ids share 3 leading blocks: the second finds exactly
    those 3 blocks (48 tokens) in the server's prefix cache, not its fifth (same id, but after
    a different fourth)."""
    import time

    cfg = ServeConfig().with_overrides(
        model={"name": MODEL, "cache_dir": str(tmp_path)},
        cluster={"num_workers": 1},
        router={"mode": "colocated"},
        policy={"name": "fixed"},
        engine={"block_size": 16, "prefix_caching": True},
    )
    first = [TraceRequest(0.0, 80, 2, (7, 8, 9, 10, 11))]
    second = [TraceRequest(0.0, 80, 2, (7, 8, 9, 12, 11))]
    config = ReplayConfig(url="", show_progress=False, token_ids=True, timeout_s=120, hash_block_tokens=16)

    def hits(service) -> int:
        stats = [i.stats for i in service.router.instances.values() if i.stats is not None]
        return sum(s.prefix_hits for s in stats)

    with running(cfg) as (service, lt):
        url, server = start_http(service, lt)
        try:
            config = dataclasses.replace(config, url=url)
            before = hits(service)
            done = [*asyncio.run(replay(first, config)), *asyncio.run(replay(second, config))]
            deadline = time.monotonic() + 60  # instance stats come with the workers' heartbeats
            while hits(service) - before < 48 and time.monotonic() < deadline:
                time.sleep(0.2)
            gained = hits(service) - before
        finally:
            stop_http(server, lt)
    assert [r.status for r in done] == ["ok", "ok"], [r.error for r in done]
    assert gained == 48


def test_a_random_model_with_another_models_tokenizer_takes_text_and_response_format(tmp_path) -> None:
    """`[model] tokenizer`: a random-weight model (no tokenizer of its own) served with a
    byte-level one answers a text prompt with JSON that fits the schema asked for."""
    import json

    import httpx
    import jsonschema

    from tests.conftest import byte_tokenizer

    byte_tokenizer().save_pretrained(str(tmp_path / "tok"))
    cfg = ServeConfig().with_overrides(
        model={"name": MODEL, "cache_dir": str(tmp_path / "cache"), "tokenizer": str(tmp_path / "tok")},
        cluster={"num_workers": 1},
        router={"mode": "colocated"},
        policy={"name": "fixed"},
    )
    schema = {
        "type": "object",
        "properties": {
            "kind": {"enum": ["cat", "dog"]},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["kind", "n"],
        "additionalProperties": False,
    }
    body = {
        "model": MODEL,
        "prompt": "An animal as JSON:",
        "max_tokens": 64,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "pet", "schema": schema}},
    }
    with running(cfg) as (service, lt):
        url, server = start_http(service, lt)
        try:
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        finally:
            stop_http(server, lt)
    assert r.status_code == 200, r.text
    [choice] = r.json()["choices"]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["text"]), schema)
