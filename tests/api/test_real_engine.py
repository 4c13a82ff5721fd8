"""The API over the real SmolLM2-135M engine: greedy text over HTTP equals `engine.generate`.

Builds the engine from the session's shared SmolLM2 weights and tokenizer (what
`LLMEngine.from_model("smollm2-135m")` loads), with a small KV cache.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from blitzscale.api.app import create_app
from blitzscale.core.config import EngineConfig
from blitzscale.core.sampling import SamplingParams
from blitzscale.engine.engine import LLMEngine

from .conftest import BASE_URL
from .engine_backend import EngineBackend
from .helpers import assert_error, sse_data, sse_json

pytestmark = [pytest.mark.real_model, pytest.mark.anyio]

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name a colour."}]
MAX_TOKENS = 10


@pytest.fixture
def engine(smollm2_weights: Any, smollm2_tokenizer: Any) -> LLMEngine:
    return LLMEngine(smollm2_weights, smollm2_tokenizer, EngineConfig(num_kv_blocks=16, max_model_len=512))


async def test_greedy_over_http_equals_the_engine(engine: LLMEngine) -> None:
    greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    backend = EngineBackend(engine, "smollm2-135m")  # only to encode, before the loop runs
    [direct] = engine.generate([backend.encode(PROMPT)], greedy)
    [direct_chat] = engine.generate([backend.encode_chat(MESSAGES)], greedy)
    assert direct.text and direct_chat.text

    async with (
        EngineBackend.running(engine, "smollm2-135m") as backend,
        httpx.AsyncClient(transport=httpx.ASGITransport(create_app(backend)), base_url=BASE_URL) as client,
    ):
        body = {"model": "smollm2-135m", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
        r = await client.post("/v1/completions", json=body)
        assert r.json()["choices"][0]["text"] == direct.text
        assert r.json()["usage"]["completion_tokens"] == len(direct.token_ids)

        chunks = sse_json((await client.post("/v1/completions", json=body | {"stream": True})).text)
        assert "".join(c["choices"][0]["text"] for c in chunks) == direct.text

        tgi = {"inputs": PROMPT, "parameters": {"max_new_tokens": MAX_TOKENS}}
        events = [json.loads(e) for e in sse_data((await client.post("/generate_stream", json=tgi)).text)]
        assert [e["token"]["id"] for e in events] == direct.token_ids
        assert events[-1]["generated_text"] == direct.text

        chat = {"messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0}
        r = await client.post("/v1/chat/completions", json=chat)
        assert r.json()["choices"][0]["message"]["content"] == direct_chat.text

        r = await client.post("/v1/completions", json={"prompt": "word " * 600})
        assert_error(r, 400, param="prompt", says="but the context is 512 tokens")
        r = await client.post("/v1/completions", json={"prompt": [1, 10**6]})
        assert_error(r, 400, param="prompt", says="outside the vocabulary")
        long_chat = {"messages": [{"role": "user", "content": "word " * 600}]}  # (a chat sends messages)
        assert_error(await client.post("/v1/chat/completions", json=long_chat), 400, param="messages")
        r = await client.post("/v1/completions", json=body | {"max_tokens": 0})
        assert_error(r, 400, says="max_tokens must be at least 1, got 0")
        assert (await client.post("/v1/completions", json=body)).json()["choices"][0]["text"] == direct.text
    assert not engine.has_unfinished()


async def test_logprobs_and_tgi_details_over_http_equal_the_engine(engine: LLMEngine) -> None:
    """Completions logprobs, chat logprobs and TGI details.tokens carry the engine's values."""
    backend = EngineBackend(engine, "smollm2-135m")
    params = SamplingParams(max_tokens=6, temperature=0, logprobs=2)
    outs = list(engine.stream(backend.encode(PROMPT), params))
    want = [lp for o in outs for lp in o.logprobs]
    ids = outs[-1].token_ids
    async with (
        EngineBackend.running(engine, "smollm2-135m") as backend,
        httpx.AsyncClient(transport=httpx.ASGITransport(create_app(backend)), base_url=BASE_URL) as client,
    ):
        body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 2}
        lp = (await client.post("/v1/completions", json=body)).json()["choices"][0]["logprobs"]
        assert lp["tokens"] == [backend.decode([i]) for i in ids]
        assert lp["token_logprobs"] == pytest.approx([x.logprob for x in want], abs=1e-5)
        assert all(len(t) <= 2 for t in lp["top_logprobs"])
        chunks = sse_json((await client.post("/v1/completions", json=body | {"stream": True})).text)
        streamed = [v for c in chunks for v in (c["choices"][0]["logprobs"] or {}).get("token_logprobs", [])]
        assert streamed == pytest.approx(lp["token_logprobs"], abs=1e-6)
        tgi = {"inputs": PROMPT, "parameters": {"max_new_tokens": 6, "details": True}}
        tokens = (await client.post("/generate", json=tgi)).json()["details"]["tokens"]
        assert [t["id"] for t in tokens] == ids
        assert [t["logprob"] for t in tokens] == pytest.approx([x.logprob for x in want], abs=1e-5)


async def test_echo_scores_the_prompt_as_transformers_does(engine: LLMEngine, smollm2_hf: Any) -> None:
    """`echo` with `logprobs` (lm-evaluation-harness's loglikelihood requests, vLLM's
    shape): the prompt's tokens lead each choice's entries, the first with null, the others
    with transformers' log-softmax at the position before; `max_tokens` 0 gives the prompt
    alone. TGI's decoder_input_details carries the same prompt logprobs."""
    import torch

    backend = EngineBackend(engine, "smollm2-135m")
    prompt = backend.encode(PROMPT)
    with torch.no_grad():
        ref = torch.log_softmax(smollm2_hf(torch.tensor([prompt])).logits[0, :-1].float(), dim=-1)
    want = [ref[i, prompt[i + 1]].item() for i in range(len(prompt) - 1)]
    best = [backend.decode([int(ref[i].argmax())]) for i in range(len(prompt) - 1)]
    [direct] = engine.generate([prompt], SamplingParams(max_tokens=3, temperature=0))
    texts = [backend.decode([t]) for t in prompt]
    async with (
        EngineBackend.running(engine, "smollm2-135m") as backend,
        httpx.AsyncClient(transport=httpx.ASGITransport(create_app(backend)), base_url=BASE_URL) as client,
    ):
        score = {"prompt": PROMPT, "echo": True, "max_tokens": 0, "logprobs": 1, "temperature": 0}
        r = (await client.post("/v1/completions", json=score)).json()
        (choice,) = r["choices"]
        assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
        assert r["usage"]["completion_tokens"] == 0 and r["usage"]["prompt_tokens"] == len(prompt)
        lp = choice["logprobs"]
        assert lp["tokens"] == texts
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert lp["token_logprobs"][1:] == pytest.approx(want, abs=2e-3)
        assert [list(t) for t in lp["top_logprobs"][1:]] == [[b] for b in best]
        assert lp["text_offset"][:3] == [0, len(texts[0]), len(texts[0]) + len(texts[1])]

        # a batch of prompts (lm-eval's batch_size > 1): each scored as alone, in order
        r = (await client.post("/v1/completions", json=score | {"prompt": ["Hello", PROMPT]})).json()
        assert [c["index"] for c in r["choices"]] == [0, 1]
        assert [c["text"] for c in r["choices"]] == ["Hello", PROMPT]
        assert r["choices"][1]["logprobs"]["token_logprobs"][1:] == pytest.approx(want, abs=2e-3)
        assert r["usage"]["prompt_tokens"] == len(prompt) + len(backend.encode("Hello"))

        # with tokens generated (lm-eval sends max_tokens 1): the prompt, then the answer
        r = (await client.post("/v1/completions", json=score | {"max_tokens": 3})).json()
        (choice,) = r["choices"]
        assert choice["text"] == PROMPT + direct.text
        assert len(choice["logprobs"]["tokens"]) == len(prompt) + 3
        assert choice["logprobs"]["token_logprobs"][1 : len(prompt)] == pytest.approx(want, abs=2e-3)
        assert r["usage"]["completion_tokens"] == 3
        # streamed: the first chunk carries the prompt
        body = score | {"max_tokens": 3, "stream": True, "prompt": [prompt], "n": 2}
        chunks = sse_json((await client.post("/v1/completions", json=body)).text)
        for i in (0, 1):
            mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
            assert "".join(c["text"] for c in mine) == PROMPT + direct.text
            lps = [v for c in mine for v in (c["logprobs"] or {}).get("token_logprobs", [])]
            assert lps[0] is None and lps[1 : len(prompt)] == pytest.approx(want, abs=2e-3)
        # echo alone: text only
        r = (
            await client.post(
                "/v1/completions", json={"prompt": PROMPT, "echo": True, "max_tokens": 3, "temperature": 0}
            )
        ).json()
        assert r["choices"][0]["text"] == PROMPT + direct.text and r["choices"][0]["logprobs"] is None

        tgi = {"inputs": PROMPT, "parameters": {"max_new_tokens": 2, "decoder_input_details": True}}
        prefill = (await client.post("/generate", json=tgi)).json()["details"]["prefill"]
        assert [t["id"] for t in prefill] == prompt and prefill[0]["logprob"] is None
        assert [t["logprob"] for t in prefill[1:]] == pytest.approx(want, abs=2e-3)
    assert not engine.has_unfinished()


async def test_a_batchs_bad_prompt_is_named_by_its_index(engine: LLMEngine) -> None:
    """A batch is refused whole, before any prompt runs, naming the prompt at fault; token
    ids are integers (true is not one); `max_tokens` 0 (echo: the prompt alone) cannot ask
    for `min_tokens`."""
    async with (
        EngineBackend.running(engine, "smollm2-135m") as backend,
        httpx.AsyncClient(transport=httpx.ASGITransport(create_app(backend)), base_url=BASE_URL) as client,
    ):
        cases = [
            (
                {"prompt": [[1, 2], [3, 10**8]]},
                "prompt[1]",
                "prompt[1]: prompt token 100000000 at position 1",
            ),
            ({"prompt": [[504], []]}, "prompt[1]", "prompt[1]: prompt is empty"),
            ({"prompt": [[5, 6], [7] * 600]}, "prompt[1]", "prompt[1]: prompt has 600 tokens"),
            ({"prompt": [[5, 6], [7] * 500], "max_tokens": 20}, "max_tokens", "prompt[1]: max_tokens is 20"),
            ({"prompt": [True, False]}, "prompt", "valid"),
            ({"prompt": [[True, 5]]}, "prompt", "valid"),
            ({"prompt": "Hi", "echo": True, "max_tokens": 0, "min_tokens": 1}, "min_tokens", "max_tokens 0"),
        ]
        for body, param, says in cases:
            assert_error(await client.post("/v1/completions", json=body), 400, param=param, says=says)
    assert not engine.has_unfinished()
