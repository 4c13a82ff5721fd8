"""What the HTTP edge needs from the system behind it (the router, or a fake in tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from blitzscale.core.chat import ChatOptions
from blitzscale.core.outputs import RequestOutput
from blitzscale.core.sampling import SamplingParams


class ServingBackend(Protocol):
    """The router implements this; tests use an in-process fake.

    `generate` validates before it yields anything: bad input raises
    `blitzscale.errors.InvalidRequestError` (-> HTTP 400) from the first `__anext__`.
    Outputs are deltas (`RequestOutput.new_token_ids`, `.text_delta`); the last one has
    `finished=True` and a `finish_reason`. Cancelling the iteration (client gone) must be
    followed by `abort(request_id)` from the caller, which frees the request's KV blocks.
    `stream=False`: the client reads only the whole answer, so a request that lost its
    instance after some output may run again; an output with `restarted=True` then says to
    forget the earlier ones.
    """

    model_name: str
    max_model_len: int
    # Optional: `model_root`, the checkpoint's Hugging Face id (`/v1/models`' `root`),
    # `tokenizer_info() -> dict`, what `/tokenizer_info` and TGI's `/info` report of it, and
    # `validate(prompt_token_ids, params)`, what `generate` checks first (raising
    # InvalidRequestError): a batch's prompts are all checked before any runs; and
    # `chat_template() -> str | None`, the template's text (how a model writes tool calls).

    def encode(self, text: str) -> list[int]: ...

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: ChatOptions | None = None,
    ) -> list[int]:
        """The chat template's prompt, rendered as Hugging Face's `apply_chat_template` does
        (core/chat.py `render_chat`) with these tools and options."""
        ...

    def decode(self, token_ids: list[int]) -> str: ...

    def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, stream: bool = True
    ) -> AsyncIterator[RequestOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    async def reset_prefix_cache(self) -> int:
        """Every engine forgets its cached prompt prefixes; how many were told."""
        ...

    def health(self) -> dict[str, Any]: ...
