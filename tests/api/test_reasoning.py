"""Thinking apart from the answer (api/reasoning.py): fed whole or in any split, the same
reasoning and content."""

from __future__ import annotations

from typing import Any

import pytest

from blitzscale.api.reasoning import ReasoningSplit, opened_by, thinks

from .fake_backend import FakeBackend
from .helpers import sse_json


def split(text: str, thinking: bool, deltas: list[str]) -> tuple[str, str]:
    s = ReasoningSplit(thinking)
    reasoning = content = ""
    for i, d in enumerate(deltas):
        r, c = s.feed(d, finished=i == len(deltas) - 1)
        reasoning, content = reasoning + r, content + c
    return reasoning, content


@pytest.mark.parametrize(
    ("text", "thinking", "expected"),
    [
        ("<think>\nPlan it.\n</think>\n\nThe answer.", False, ("\nPlan it.\n", "The answer.")),
        ("Plan it.</think>The answer.", True, ("Plan it.", "The answer.")),  # the prompt opened it
        ("Just an answer <think> in it.", False, ("", "Just an answer <think> in it.")),
        ("  <think>a</think>b", False, ("a", "b")),
        ("Still thinking when cut", True, ("Still thinking when cut", "")),
        ("<think>cut short </thi", False, ("cut short </thi", "")),
        ("<thin", False, ("", "<thin")),  # (a tag's start, then the end: text)
        ("<think></think>\n\n", False, ("", "")),
    ],
)
def test_every_split_gives_the_same_reasoning_and_content(
    text: str, thinking: bool, expected: tuple[str, str]
) -> None:
    cuts = [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]
    for deltas in cuts:
        assert split(text, thinking, deltas) == expected, deltas


def test_a_partial_tag_is_held_until_known() -> None:
    s = ReasoningSplit(True)
    assert s.feed("step one </th") == ("step one ", "")
    assert s.feed("ink>\nyes") == ("", "yes")
    assert s.feed(" and more", finished=True) == ("", " and more")


def test_which_templates_think_and_which_prompts_open_it() -> None:
    assert thinks("{{ '<think>\\n' }}") and not thinks("{{ messages }}") and not thinks(None)
    assert opened_by("<|im_start|>assistant\n<think>\n")
    assert not opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opened_by("<|im_start|>assistant\n")


# --- over HTTP (the fake backend; its template said to teach <think>) ------------------

THINKING = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{# <think> taught #}"


@pytest.mark.anyio
async def test_a_thinking_models_reply_is_split(client: Any, fake: FakeBackend) -> None:
    fake.template, fake.reply = THINKING, "<think>\nWeigh it.\n</think>\n\nIt is 4."
    body = {"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 60}
    message = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "It is 4.", "reasoning_content": "\nWeigh it.\n"}
    chunks = sse_json((await client.post("/v1/chat/completions", json={**body, "stream": True})).text)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "\nWeigh it.\n"
    assert "".join(d.get("content", "") for d in deltas) == "It is 4."
    assert all("<" not in d.get("content", "") + d.get("reasoning_content", "") for d in deltas)
    # a prompt that leaves the block open (here: an open final message): the reply starts in it
    fake.reply = "Weigh it.</think>It is 4."
    opened = [*body["messages"], {"role": "assistant", "content": "<think>\n"}]
    open_body = {**body, "messages": opened, "continue_final_message": True, "add_generation_prompt": False}
    message = (await client.post("/v1/chat/completions", json=open_body)).json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Weigh it.", "It is 4.")
    # tools read the answer, not the thinking
    fake.reply = '<think>Call it.</think><tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'
    fake.max_model_len = 4096
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    choice = (
        await client.post("/v1/chat/completions", json={**body, "tools": [tool], "max_tokens": 200})
    ).json()["choices"][0]
    assert choice["message"]["reasoning_content"] == "Call it." and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2}'}


@pytest.mark.anyio
async def test_a_model_not_taught_to_think_keeps_its_text(client: Any, fake: FakeBackend) -> None:
    fake.reply = "<think>x</think>y"
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
    message = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "<think>x</think>y"}
