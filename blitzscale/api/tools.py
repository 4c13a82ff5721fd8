"""Tool calling on `/v1/chat/completions`: OpenAI's `tools` and `tool_choice`.

How a request's tools reach the model (`ToolPlan.prompt`):
- a chat template that renders tools itself (Qwen2.5, Llama 3.1, Hermes, ...: found by
  rendering a probe conversation with and without one) gets them as Hugging Face's
  `apply_chat_template(tools=...)` does, and the messages' calls and results as it expects
  them (arguments as objects);
- any other template (SmolLM2's) gets them from this server: a system message that lists
  them and asks for `<tool_call>` blocks, assistant calls written as such blocks, and tool
  results as user messages in `<tool_response>` blocks (nothing a client sends is dropped).

How calls come back out (`ToolPlan.parser`): `tool_choice` "auto" reads the calls the model
chose to make in its template's format (`<tool_call>` blocks, or Llama 3's JSON;
api/tool_parsers.py); "required" and a named function constrain the output with a grammar
(a JSON array of `{"name", "parameters"}` objects, or the named function's arguments), as
vLLM does; "none" renders no tools and reads no calls.
"""

from __future__ import annotations

import contextlib
import json
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from blitzscale.api.constraints import Constraint, constraint_of
from blitzscale.api.errors import ApiError
from blitzscale.api.protocol import ChatCompletionRequest, FunctionCall, ToolCall, ToolDefinition
from blitzscale.api.tool_parsers import (
    Arguments,
    Call,
    Content,
    HermesParser,
    Llama3JsonParser,
    NamedParser,
    RequiredParser,
    ToolCallParser,
)
from blitzscale.core.sampling import Grammar

Choice = Literal["none", "auto", "required", "named"]
CallFormat = Literal["hermes", "llama3_json"]

TOOLS_INTRO = (
    "You can call functions. Each one is described below, in JSON Schema, on its own line "
    "inside <tools></tools>:\n<tools>\n{tools}\n</tools>\n"
    "To call a function, reply with a JSON object holding its name and its arguments inside "
    "<tool_call></tool_call>, one block for each call:\n"
    '<tool_call>\n{{"name": "the function\'s name", "arguments": {{"an argument": "its value"}}}}'
    "\n</tool_call>"
)
_PROBE_TOOL = {"type": "function", "function": {"name": "probe", "parameters": {"type": "object"}}}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolPlan:
    tools: tuple[ToolDefinition, ...]
    choice: Choice
    named: str | None  # the function a named choice forces
    native: bool  # the chat template renders tools itself
    call_format: CallFormat | None  # how the model writes calls ("auto" reads it)
    parallel: bool  # more than one call allowed ("required")

    @property
    def names(self) -> list[str]:
        return [t.function.name for t in self.tools]

    def constraint(self) -> Constraint | None:
        """What "required" and a named choice constrain the output to."""
        grammar = self.grammar()
        return None if grammar is None else Constraint(grammar, "tools")

    def grammar(self) -> Grammar | None:
        if self.choice == "named":
            return Grammar("json_schema", json.dumps(self._parameters(self.named), ensure_ascii=False))
        if self.choice != "required":
            return None
        calls: list[dict[str, Any]] = []
        defs: dict[str, dict[str, Any]] = {}  # each tool's definitions, at the root (where refs point)
        for i, t in enumerate(self.tools):
            params = dict(self._parameters(t.function.name))
            for key in ("$defs", "definitions"):
                for name, value in (params.pop(key, None) or {}).items():
                    if defs.setdefault(key, {}).setdefault(name, value) != value:
                        where = f"tools[{i}].function.parameters.{key}.{name}"
                        raise ApiError(400, f"{where} differs from another tool's of that name", param=where)
            properties = {"name": {"type": "string", "enum": [t.function.name]}, "parameters": params}
            calls.append({"type": "object", "properties": properties, "required": ["name", "parameters"]})
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        schema.update(defs)
        if not self.parallel:
            schema["maxItems"] = 1
        return Grammar("json_schema", json.dumps(schema, ensure_ascii=False))

    def constrained(self) -> list[Constraint]:
        """Each tool the grammar holds to its parameters, with a grammar of those alone
        (compiled first, so a schema that cannot be is named)."""
        chosen = {"named": [self.named], "required": self.names}.get(self.choice, [])
        return [
            Constraint(
                Grammar("json_schema", json.dumps(self._parameters(name), ensure_ascii=False)),
                f"tools[{i}].function.parameters",
            )
            for i, name in enumerate(self.names)
            if name in chosen
        ]

    def parser(self) -> ToolCallParser | None:
        """A fresh parser for one choice's text (None: "none", plain content)."""
        if self.choice == "named":
            return NamedParser()
        if self.choice == "required":
            return RequiredParser(self.names)
        if self.choice == "auto":
            return (
                Llama3JsonParser(self.names)
                if self.call_format == "llama3_json"
                else HermesParser(self.names)
            )
        return None

    def prompt(
        self, messages: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The messages and `tools` to render (see the module's docstring)."""
        shown = [] if self.choice == "none" else [t.model_dump(exclude_none=True) for t in self.tools]
        if self.native:
            return messages, shown or None
        return plain_messages(messages, shown), None

    def _parameters(self, name: str | None) -> dict[str, Any]:
        tool = next(t for t in self.tools if t.function.name == name)
        return tool.function.parameters or {"type": "object"}


def plain_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a template without tools: the tools in the system message, calls as
    `<tool_call>` blocks, results as `<tool_response>` blocks in user messages (several
    results in a row in one message, so templates that want turns to alternate take them)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            tag = f'<tool_response name="{m["name"]}">' if m.get("name") else "<tool_response>"
            block = f"{tag}\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_results": True})
            continue
        calls = [
            "<tool_call>\n"
            + json.dumps(
                {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}, ensure_ascii=False
            )
            + "\n</tool_call>"
            for c in m.get("tool_calls") or ()
        ]
        m = {k: v for k, v in m.items() if k != "tool_calls"}
        if calls:
            m["content"] = "\n".join(([m["content"]] if m["content"] else []) + calls)
        out.append(m)
    out = [{k: v for k, v in m.items() if k != "_results"} for m in out]
    if tools:
        intro = TOOLS_INTRO.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{intro}"}
        else:
            out.insert(0, {"role": "system", "content": intro})
    return out


def call_format(template: str | None) -> CallFormat | None:
    """The call format a tool-rendering chat template teaches, where this server reads it."""
    if not template:
        return None
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or '"parameters": dictionary' in template:
        return "llama3_json"
    return None


_RENDERS_TOOLS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def renders_tools(backend: Any, encode_chat: Callable[..., list[int]]) -> bool:
    """Whether the backend's chat template renders a request's tools (a probe conversation
    rendered with and without a tool differs), once per backend."""
    with contextlib.suppress(KeyError, TypeError):  # (TypeError: not weakly referable)
        return _RENDERS_TOOLS[backend]
    probe = [{"role": "user", "content": "hi"}]
    try:
        found = encode_chat(probe, [_PROBE_TOOL]) != encode_chat(probe, None)
    except Exception:  # a template that fails on tools does not render them
        found = False
    with contextlib.suppress(TypeError):
        _RENDERS_TOOLS[backend] = found
    return found


def plan_tools(body: ChatCompletionRequest, native: bool, template: str | None) -> ToolPlan | None:
    """The request's tool plan (None: no tools), or a 400 naming what cannot be served."""
    tools = tuple(body.tools or ())
    choice_field = body.tool_choice
    if not tools:
        if choice_field not in (None, "none", "auto"):
            raise ApiError(400, "tool_choice needs tools", param="tool_choice")
        return None
    names = [t.function.name for t in tools]
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        raise ApiError(400, f"tools name the function {dup!r} twice", param="tools")
    named = None
    if choice_field is None:
        choice: Choice = "auto"
    elif isinstance(choice_field, str):
        choice = choice_field
    else:
        choice, named = "named", choice_field.function.name
        if named not in names:
            raise ApiError(
                400, f"tool_choice names the function {named!r}, which is not in tools", param="tool_choice"
            )
    shaped = constraint_of(body)
    if shaped is not None and choice != "none":
        field = shaped.field.split(".")[0]
        raise ApiError(
            400,
            f"{field} cannot be combined with tools (both shape the reply): use tool_choice "
            f'"none" or leave {field} out',
            param=field,
        )
    fmt = call_format(template) if native else "hermes"
    if choice == "auto" and fmt is None:
        raise ApiError(
            400,
            'tool_choice "auto" needs calls in a format this server reads (<tool_call> blocks or Llama 3 '
            'JSON), and this model\'s chat template asks for another: use tool_choice "required" or '
            "name a function",
            param="tool_choice",
        )
    return ToolPlan(tools, choice, named, native, fmt, body.parallel_tool_calls is not False)


def chat_prompt(
    messages: list[dict[str, Any]], plan: ToolPlan | None, native: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and `tools` a request renders; without tools, a template that has none
    still gets earlier calls and results written out (`plain_messages`)."""
    if plan is not None:
        return plan.prompt(messages)
    if not native and any(m["role"] == "tool" or m.get("tool_calls") for m in messages):
        return plain_messages(messages, []), None
    return messages, None


class ChoiceCalls:
    """One choice's tool calls as its text comes: the content to show and the calls (OpenAI's
    stream deltas: each call whole, with its `index`, `id` and name; a named choice's
    arguments as they come)."""

    def __init__(self, plan: ToolPlan) -> None:
        self._plan = plan
        self._parser = plan.parser()
        self.calls = 0

    def step(self, text: str, finished: bool) -> tuple[str, list[dict[str, Any]]]:
        if self._parser is None:
            return text, []
        pieces = self._parser.feed(text) + (self._parser.finish() if finished else [])
        content = "".join(p.text for p in pieces if isinstance(p, Content))
        deltas: list[dict[str, Any]] = []
        for p in pieces:
            if isinstance(p, Call) or (isinstance(p, Arguments) and not self.calls):
                name, args = (p.name, p.arguments) if isinstance(p, Call) else (self._plan.named, p.text)
                fn = {"name": name, "arguments": args}
                deltas.append({"index": self.calls, "id": new_call_id(), "type": "function", "function": fn})
                self.calls += 1
            elif isinstance(p, Arguments):
                deltas.append({"index": 0, "function": {"arguments": p.text}})
        return content, deltas

    def whole(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A whole reply's content (null when it is calls alone) and calls."""
        content, deltas = self.step(text, True)
        calls = [ToolCall(id=d["id"], function=FunctionCall(**d["function"])) for d in deltas]
        return (content if content or not calls else None), calls

    def finish_reason(self, reason: str | None) -> str | None:
        """ "tool_calls" when the model chose to call ("auto", "required") and stopped by
        itself; a named choice stops as OpenAI's do ("stop")."""
        chose = self._plan.choice in ("auto", "required")
        return "tool_calls" if reason == "stop" and self.calls and chose else reason
