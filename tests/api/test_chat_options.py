"""vLLM's chat template options over the fake backend (its template: `[mood]` when the
`mood` variable is set, then `<role>content\\n` per message, then `<assistant>`)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from .fake_backend import FakeBackend
from .helpers import assert_error

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "hi"}
PREFILLED = [USER, {"role": "assistant", "content": "Sure, "}]


async def chat(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await client.post("/v1/chat/completions", json={"messages": [USER], "max_tokens": 1, **body})


async def test_options_reach_the_template(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    r = await chat(client, messages=PREFILLED, add_generation_prompt=False, continue_final_message=True)
    assert r.status_code == 200, r.text
    assert fake.decode(fake.calls[-1].prompt_token_ids) == "<user>hi\n<assistant>Sure, "  # left open
    await chat(client, add_generation_prompt=False)
    assert fake.decode(fake.calls[-1].prompt_token_ids) == "<user>hi\n"
    await chat(client, chat_template_kwargs={"mood": "calm"})
    assert fake.decode(fake.calls[-1].prompt_token_ids) == "[calm]<user>hi\n<assistant>"
    r = await client.post("/tokenize", json={"messages": [USER]})  # (the defaults: as before)
    assert r.json()["tokens"] == fake.encode("<user>hi\n<assistant>")


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"messages": PREFILLED, "continue_final_message": True}, "continue_final_message", "cannot both"),
        (
            {"continue_final_message": True, "add_generation_prompt": False},
            "continue_final_message",
            "(it is a user's)",
        ),
        ({"chat_template_kwargs": {"colour": "red"}}, "chat_template_kwargs.colour", "not read by"),
        ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools", "not a template variable"),
        (
            {"chat_template_kwargs": {"messages": []}},
            "chat_template_kwargs.messages",
            "not a template variable",
        ),
        ({"add_generation_prompt": "yes"}, "add_generation_prompt", "boolean"),
    ],
)
async def test_bad_options_are_refused_by_name(
    client: httpx.AsyncClient, fake: FakeBackend, body: dict[str, Any], param: str, says: str
) -> None:
    assert_error(await chat(client, **body), 400, param=param, says=says)
    assert fake.calls == []
