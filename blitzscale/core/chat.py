"""Rendering chat messages with a model's chat template: the options a request may set and
the one call every renderer makes (the router's model backend, `blitzscale generate`,
tests' backends), as Hugging Face's `apply_chat_template` does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ChatOptions:
    """How the template renders the messages (vLLM's chat options)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False  # the last (assistant) message is left open
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # more template variables


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    options: ChatOptions | None = None,
) -> list[int]:
    """The prompt's token ids (`tools`: transformers' own `tools` argument)."""
    o = options or ChatOptions()
    ids = tokenizer.apply_chat_template(
        messages,
        tools=tools,
        add_generation_prompt=o.add_generation_prompt,
        continue_final_message=o.continue_final_message,
        tokenize=True,
        **dict(o.template_kwargs),
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
