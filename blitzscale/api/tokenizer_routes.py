"""vLLM's tokenizer routes, for clients that count tokens through the server rather than
with a tokenizer of their own: `/tokenize` (a text, or chat messages through the chat
template) -> `{"count", "max_model_len", "tokens"}`, and `/detokenize` (`{"tokens"}`) ->
`{"prompt"}`. Both tokenize off the event loop, like the generation routes."""

from __future__ import annotations

from fastapi import APIRouter

from blitzscale.api.backend import ServingBackend
from blitzscale.api.chat_prompt import chat_message, encode_chat, tool_prompt
from blitzscale.api.errors import ApiError
from blitzscale.api.openai_routes import backend_for
from blitzscale.api.protocol import (
    ChatCompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from blitzscale.api.tokenize import off_loop


def tokenizer_router(default: ServingBackend) -> APIRouter:
    router = APIRouter()

    @router.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        backend = backend_for(default, body.model)
        if (body.prompt is None) == (body.messages is None):
            raise ApiError(400, "send either prompt or messages", param="prompt")
        if body.tools and body.messages is None:
            raise ApiError(400, "tools are read only with messages", param="tools")
        if not body.add_special_tokens:
            raise ApiError(
                400, "add_special_tokens=false is not supported by this server", param="add_special_tokens"
            )
        if body.messages is not None:
            if not body.add_generation_prompt:
                raise ApiError(
                    400,
                    "add_generation_prompt=false is not supported by this server",
                    param="add_generation_prompt",
                )
            messages = [chat_message(m, i) for i, m in enumerate(body.messages)]
            chat = ChatCompletionRequest(messages=body.messages, tools=body.tools)  # (the chat prompt's)
            _, (messages, tools) = await off_loop(tool_prompt, backend, chat, messages)
            ids = await off_loop(encode_chat, backend, messages, tools)
        else:
            ids = await off_loop(backend.encode, body.prompt or "") if body.prompt else []
        return TokenizeResponse(count=len(ids), max_model_len=backend.max_model_len, tokens=ids)

    @router.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        backend = backend_for(default, body.model)
        return DetokenizeResponse(prompt=await off_loop(backend.decode, body.tokens))

    return router
