"""`/tokenize` and `/detokenize` in vLLM's shapes, `/v1/models/{id}`, and their errors."""

from __future__ import annotations

import httpx
import pytest

from .fake_backend import FakeBackend
from .helpers import assert_error

pytestmark = pytest.mark.anyio


async def test_tokenize_a_prompt_and_chat_messages(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    r = await client.post("/tokenize", json={"model": "fake-model", "prompt": "hey"})
    assert r.status_code == 200
    assert r.json() == {"count": 3, "max_model_len": 128, "tokens": [104, 101, 121], "token_strs": None}
    chat = await client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
    assert chat.json()["tokens"] == fake.encode_chat([{"role": "user", "content": "hi"}])


async def test_detokenize_inverts_tokenize(client: httpx.AsyncClient) -> None:
    ids = (await client.post("/tokenize", json={"prompt": "round trip"})).json()["tokens"]
    r = await client.post("/detokenize", json={"tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": "round trip"}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, 400, "prompt"),
        ("/tokenize", {"prompt": "x", "add_special_tokens": False}, 400, "add_special_tokens"),
        ("/tokenize", {"prompt": "x", "truncate": 3}, 400, "truncate"),
        ("/tokenize", {"prompt": "x", "model": "other"}, 404, "model"),
        ("/detokenize", {"tokens": ["a"]}, 400, "tokens[0]"),
        ("/detokenize", {}, 400, "tokens"),
    ],
)
async def test_tokenizer_errors(
    client: httpx.AsyncClient, path: str, body: dict, status: int, param: str
) -> None:
    assert_error(await client.post(path, json=body), status, param=param)
    assert (await client.post("/tokenize", json={"prompt": "ok"})).status_code == 200


async def test_model_by_id(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    card = (await client.get("/v1/models/fake-model")).json()
    assert card["id"] == "fake-model" and card["object"] == "model" and card["root"] == "fake-model"
    fake.model_root = "org/fake"  # type: ignore[attr-defined]
    assert (await client.get("/v1/models")).json()["data"][0]["root"] == "org/fake"
    assert_error(await client.get("/v1/models/org/other"), 404, param="model", says="org/other")
