"""vLLM's `structured_outputs` and TGI's `grammar` at the edge (over the fake backend): each
becomes the one Grammar the engine enforces; a bad one is a 400 naming its field."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from blitzscale.api.constraints import choice_grammar
from blitzscale.core.sampling import Grammar

from .fake_backend import FakeBackend
from .helpers import assert_error, assert_tgi_error

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize(
    ("structured", "grammar"),
    [
        ({"json": SCHEMA}, Grammar("json_schema", json.dumps(SCHEMA))),
        ({"json": json.dumps(SCHEMA)}, Grammar("json_schema", json.dumps(SCHEMA))),
        ({"regex": r"\d{3}"}, Grammar("regex", r"\d{3}")),
        ({"choice": ["yes", 'a "quote"']}, Grammar("ebnf", 'root ::= "yes" | "a \\"quote\\""')),
        ({"grammar": 'root ::= "x"+'}, Grammar("ebnf", 'root ::= "x"+')),
        ({"json_object": True}, Grammar("json_object")),
    ],
)
async def test_structured_outputs_become_one_grammar(
    client: httpx.AsyncClient, fake: FakeBackend, structured: dict[str, Any], grammar: Grammar
) -> None:
    for path, body in (
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ):
        r = await client.post(path, json={**body, "structured_outputs": structured})
        assert r.status_code == 200, r.text
        assert fake.calls[-1].params.grammar == grammar


def test_a_choice_is_each_literal_escaped() -> None:
    assert choice_grammar(["a\nb", "é"]).schema == 'root ::= "a\\nb" | "é"'


@pytest.mark.parametrize(
    ("structured", "param", "says"),
    [
        ({}, "structured_outputs", "exactly one"),
        ({"regex": "a", "choice": ["a"]}, "structured_outputs", "got regex, choice"),
        ({"json_object": False}, "structured_outputs", "got none"),
        ({"json": "{oops"}, "structured_outputs.json", "not a JSON Schema"),
        ({"choice": []}, None, "at least 1"),
        ({"regex": ""}, None, "at least 1"),
        ({"whitespace_pattern": " "}, None, "extra"),
        ({"structural_tag": "x"}, None, "extra"),
    ],
)
async def test_bad_structured_outputs_are_refused_by_name(
    client: httpx.AsyncClient, fake: FakeBackend, structured: dict[str, Any], param: str | None, says: str
) -> None:
    r = await client.post("/v1/completions", json={"prompt": "hi", "structured_outputs": structured})
    assert_error(r, 400, param=param, says=says)
    assert fake.calls == []


async def test_two_ways_of_shaping_one_output_are_refused(client: httpx.AsyncClient) -> None:
    body = {"prompt": "hi", "structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}
    assert_error(
        await client.post("/v1/completions", json=body), 400, param="structured_outputs", says="send one"
    )
    tool = {"type": "function", "function": {"name": "f"}}
    chat = {
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [tool],
        "structured_outputs": {"regex": "a"},
    }
    r = await client.post("/v1/chat/completions", json=chat)
    assert_error(r, 400, param="structured_outputs", says="cannot be combined with tools")


async def test_tgi_grammar(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    for grammar, want in (
        ({"type": "json", "value": SCHEMA}, Grammar("json_schema", json.dumps(SCHEMA))),
        ({"type": "json", "value": json.dumps(SCHEMA)}, Grammar("json_schema", json.dumps(SCHEMA))),
        ({"type": "regex", "value": "[ab]+"}, Grammar("regex", "[ab]+")),
    ):
        r = await client.post("/generate", json={"inputs": "hi", "parameters": {"grammar": grammar}})
        assert r.status_code == 200, r.text
        assert fake.calls[-1].params.grammar == want
    r = await client.post(
        "/generate", json={"inputs": "hi", "parameters": {"grammar": {"type": "json", "value": 3}}}
    )
    assert_tgi_error(r, 422, param="parameters.grammar.value", says="JSON Schema")
