"""A chat request's prompt: its messages as chat templates read them (`chat_message`), its
tools (api/tools.py) and the template's options (vLLM's `add_generation_prompt`,
`continue_final_message` and `chat_template_kwargs`), rendered by the backend's chat
template (`encode_chat`), with nothing a client sent dropped unseen: a message's `name`
or a template variable the template does not read is refused by name."""

from __future__ import annotations

import json
from typing import Any

from blitzscale.api.backend import ServingBackend
from blitzscale.api.errors import ApiError
from blitzscale.api.protocol import (
    MESSAGE_UNSET,
    ChatCompletionRequest,
    ChatMessage,
    ToolCall,
    first_set_extra,
)
from blitzscale.api.tools import ToolPlan, chat_prompt, plan_tools, renders_tools
from blitzscale.core.chat import ChatOptions

# apply_chat_template's own arguments: not template variables a client may set
RESERVED_KWARGS = frozenset(
    {"messages", "conversation", "tools", "documents", "add_generation_prompt", "continue_final_message",
     "tokenize", "chat_template", "return_dict", "return_tensors", "padding", "truncation", "max_length",
     "return_assistant_tokens_mask", "tokenizer_kwargs"}
)  # fmt: skip


def chat_render(
    body: ChatCompletionRequest, messages: list[dict[str, Any]], template: str | None
) -> ChatOptions:
    """The request's options, checked: not both a generation prompt and an open final
    message, an open final message only an assistant's, template variables only those the
    template reads (when its text is known)."""
    if body.add_generation_prompt and body.continue_final_message:
        message = (
            "continue_final_message and add_generation_prompt cannot both be true: "
            "set add_generation_prompt false"
        )
        raise ApiError(400, message, param="continue_final_message")
    if body.continue_final_message and messages[-1]["role"] != "assistant":
        role = messages[-1]["role"]
        message = f"continue_final_message needs the last message to be an assistant's (it is a {role}'s)"
        raise ApiError(400, message, param="continue_final_message")
    kwargs = dict(body.chat_template_kwargs or {})
    used = template_variables(template) if kwargs else None
    for name in kwargs:
        where = f"chat_template_kwargs.{name}"
        if name in RESERVED_KWARGS:
            raise ApiError(
                400, f"{where} is not a template variable (the request's own field sets it)", param=where
            )
        if used is not None and name not in used:
            raise ApiError(400, f"{where} is not read by this model's chat template", param=where)
    return ChatOptions(body.add_generation_prompt, body.continue_final_message, kwargs)


def template_variables(template: str | None) -> set[str] | None:
    """The variables a chat template reads (None: its text is unknown or does not parse
    here, and nothing is refused on its account)."""
    if not template:
        return None
    try:
        from jinja2 import meta
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(extensions=[loopcontrols])
        return set(meta.find_undeclared_variables(env.parse(template)))
    except Exception:  # (a template using transformers' own tags: not checked)
        return None


def chat_message(message: ChatMessage, index: int) -> dict[str, Any]:
    """The plain dict `encode_chat` takes (tool calls' arguments as objects, as chat templates
    read them); content parts must all be text, and nothing else a message carries is
    dropped unseen (cache hints, ...: refused by name)."""
    where = f"messages[{index}]"
    if (field := message.unsupported_field()) is not None:
        raise ApiError(400, f"{where}.{field} is not supported by this server", param=f"{where}.{field}")
    for name, role in (("tool_calls", "assistant"), ("tool_call_id", "tool")):
        if getattr(message, name) not in (None, []) and message.role != role:
            raise ApiError(400, f"{where}.{name} belongs on a {role} message", param=f"{where}.{name}")
    if message.role == "tool" and not message.tool_call_id:
        raise ApiError(
            400, f"{where}.tool_call_id is required on a tool message", param=f"{where}.tool_call_id"
        )
    calls = [tool_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(message.tool_calls or ())]
    content = message.content
    if content is None and calls:
        content = ""
    if content is None:
        raise ApiError(400, f"{where}.content is required", param=f"{where}.content")
    if isinstance(content, list):
        if any(part.type != "text" or part.text is None for part in content):
            raise ApiError(400, "only text content parts are supported", param=f"{where}.content")
        for j, part in enumerate(content):
            if (field := first_set_extra(part.model_extra, unset=MESSAGE_UNSET)) is not None:
                name = f"{where}.content[{j}].{field}"
                raise ApiError(400, f"{name} is not supported by this server", param=name)
        content = "".join(part.text or "" for part in content)
    out: dict[str, Any] = {"role": message.role, "content": content or ""}
    if message.name is not None:
        out["name"] = message.name
    if calls:
        out["tool_calls"] = calls
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def tool_call(call: ToolCall, where: str) -> dict[str, Any]:
    """A call an assistant made, as chat templates read it: its arguments as an object."""
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        name = f"{where}.function.arguments"
        raise ApiError(400, f"{name} must be a JSON object's text", param=name)
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.function.name, "arguments": arguments},
    }


def tool_prompt(
    backend: ServingBackend, body: ChatCompletionRequest | None, messages: list[dict[str, Any]]
) -> tuple[ToolPlan | None, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    """The request's tool plan (none without a body: `/tokenize`), and the messages and tools
    its prompt renders (api/tools.py); the chat template is probed only when the request has
    tools or earlier calls."""
    asked = (body is not None and bool(body.tools)) or any(
        m["role"] == "tool" or "tool_calls" in m for m in messages
    )
    native = asked and renders_tools(backend, backend.encode_chat)
    template = getattr(backend, "chat_template", None)
    plan = None
    if body is not None:
        plan = plan_tools(body, native, template() if native and callable(template) else None)
    return plan, chat_prompt(messages, plan, native)


def encode_chat(
    backend: ServingBackend,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    options: ChatOptions | None = None,
) -> list[int]:
    """`backend.encode_chat`, refusing messages' `name`s when the model's chat template renders
    none of them (they would be dropped unseen; SmolLM2's drops them): the prompt is rendered
    again without the names, only when a message has one, and compared. (One render for all
    names: a template that renders some roles' names and not others' passes.)"""
    ids = backend.encode_chat(messages, tools, options)
    named = [i for i, m in enumerate(messages) if "name" in m]
    unnamed = [{k: v for k, v in m.items() if k != "name"} for m in messages]
    if named and backend.encode_chat(unnamed, tools, options) == ids:
        where = f"messages[{named[0]}].name"
        raise ApiError(
            400, f"{where} is not supported: this model's chat template does not use it", param=where
        )
    return ids
