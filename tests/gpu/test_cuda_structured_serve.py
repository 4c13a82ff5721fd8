"""Structured output through `serve` on the GPU (issue 33's H200 check): random Llama-3-8B
weights with a borrowed tokenizer (`[model] tokenizer`: a byte-level one with a chat
template, made here, offline), the twenty held-out schemas sent at once through the openai
client's chat API; every answer parses and validates. Run on the GPU machine (the openai,
httpx and jsonschema wheels travel in `.whl/`): `make test-gpu`."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MODEL = "random:llama3-8b"
# A plain template: each message on its own line, then the assistant's turn.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def test_twenty_held_out_schemas_on_a_random_8b_through_the_openai_client(tmp_path: Path) -> None:
    import jsonschema
    import openai

    from blitzscale.serve.config import ServeConfig
    from tests.conftest import byte_tokenizer
    from tests.serve.conftest import running, start_http, stop_http
    from tests.serve.structured_schemas import MAX_TOKENS, SCHEMAS

    tok = byte_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(tmp_path / "tok"))
    cfg = ServeConfig().with_overrides(
        model={"name": MODEL, "tokenizer": str(tmp_path / "tok")},
        cluster={"num_workers": 1, "device": "cuda"},
        router={"mode": "colocated"},
        policy={"name": "fixed"},
    )
    # (a byte a token: the longest answers need more than the CPU test's budget)
    max_tokens = 3 * MAX_TOKENS

    def ask(client: openai.OpenAI, case: tuple[str, str, dict[str, Any]]) -> Any:
        name, question, schema = case
        return client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"{question} Answer in JSON."}],
            max_tokens=max_tokens,
            temperature=0,
            response_format={  # type: ignore[arg-type]
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": True},
            },
        )

    with running(cfg) as (service, lt):
        url, server = start_http(service, lt)
        try:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
            with ThreadPoolExecutor(len(SCHEMAS)) as pool:
                answers = list(pool.map(lambda c: ask(client, c), SCHEMAS))
        finally:
            stop_http(server, lt)
    for (name, _, schema), answer in zip(SCHEMAS, answers, strict=True):
        choice = answer.choices[0]
        assert choice.finish_reason == "stop", (name, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), schema)
