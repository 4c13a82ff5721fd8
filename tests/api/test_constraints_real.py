"""vLLM's `structured_outputs` (regex, choice, EBNF grammar) and TGI's `grammar` over the real
SmolLM2-135M engine: greedy answers over HTTP match their constraint and are the engine's own
answers under the same Grammar; one the library cannot compile is a 400 naming its field."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from blitzscale.api.app import create_app
from blitzscale.core.config import EngineConfig
from blitzscale.core.sampling import Grammar, SamplingParams
from blitzscale.engine.engine import LLMEngine

from .conftest import BASE_URL
from .engine_backend import EngineBackend
from .helpers import assert_error, assert_tgi_error

pytestmark = [pytest.mark.real_model, pytest.mark.anyio]

PROMPT = "My phone number is"
CASES = [  # (structured_outputs, the Grammar it is, what a whole answer must match)
    ({"regex": r"\d{3}-\d{4}"}, Grammar("regex", r"\d{3}-\d{4}"), r"\d{3}-\d{4}"),
    (
        {"choice": ["Paris", "London", "Rome"]},
        Grammar("ebnf", 'root ::= "Paris" | "London" | "Rome"'),
        "Paris|London|Rome",
    ),
    ({"grammar": 'root ::= ("yes" | "no") "!"'}, Grammar("ebnf", 'root ::= ("yes" | "no") "!"'), "(yes|no)!"),
]


class CheckingBackend(EngineBackend):
    """The engine's backend with the edge's compile check, as `serve`'s model backend has."""

    def check_grammar(self, grammar: Grammar) -> None:
        self.engine.grammar_masks.check(grammar)  # (the engine's compiler: its tokenizer's, built once)


@pytest.fixture
def engine(smollm2_weights: Any, smollm2_tokenizer: Any) -> LLMEngine:
    return LLMEngine(smollm2_weights, smollm2_tokenizer, EngineConfig(num_kv_blocks=16, max_model_len=512))


async def test_constrained_answers_are_the_engines(engine: LLMEngine) -> None:
    ids = EngineBackend(engine, "smollm2-135m").encode(PROMPT)
    wants = [
        engine.generate([ids], SamplingParams(max_tokens=12, temperature=0, grammar=g))[0]
        for _, g, _ in CASES
    ]
    regex = Grammar("regex", "[A-Z][a-z]+")
    [tgi_want] = engine.generate([ids], SamplingParams(max_tokens=12, temperature=0, grammar=regex))
    async with (
        CheckingBackend.running(engine, "smollm2-135m") as backend,
        httpx.AsyncClient(transport=httpx.ASGITransport(create_app(backend)), base_url=BASE_URL) as client,
    ):
        for (structured, _, pattern), want in zip(CASES, wants, strict=True):
            body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "structured_outputs": structured}
            choice = (await client.post("/v1/completions", json=body)).json()["choices"][0]
            assert choice["text"] == want.text and re.fullmatch(pattern, want.text), (structured, want.text)
            assert choice["finish_reason"] == "stop"
        tgi = {
            "inputs": PROMPT,
            "parameters": {"max_new_tokens": 12, "grammar": {"type": "regex", "value": "[A-Z][a-z]+"}},
        }
        r = await client.post("/generate", json=tgi)
        assert r.json()["generated_text"] == tgi_want.text and re.fullmatch("[A-Z][a-z]+", tgi_want.text)

        bad = {"prompt": PROMPT, "structured_outputs": {"regex": "(unclosed"}}
        r = await client.post("/v1/completions", json=bad)
        assert_error(r, 400, param="structured_outputs.regex", says="parenthesis is not closed")
        bad = {"prompt": PROMPT, "structured_outputs": {"grammar": "root ::= foo"}}
        r = await client.post("/v1/completions", json=bad)
        assert_error(r, 400, param="structured_outputs.grammar", says='Rule "foo" is not defined')
        bad_tgi = {"inputs": PROMPT, "parameters": {"grammar": {"type": "regex", "value": "a{2,1}"}}}
        r = await client.post("/generate", json=bad_tgi)
        assert_tgi_error(r, 422, param="parameters.grammar", says="lower bound is larger")
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        body = {"prompt": PROMPT, "max_tokens": 20, "temperature": 0, "structured_outputs": {"json": schema}}
        text = (await client.post("/v1/completions", json=body)).json()["choices"][0]["text"]
        assert isinstance(json.loads(text)["ok"], bool)
    assert not engine.has_unfinished()
