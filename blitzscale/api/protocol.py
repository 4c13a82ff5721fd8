"""Request bodies of the OpenAI (`/v1/...`) HTTP API and vLLM's tokenizer routes, validated
by pydantic (the responses: api/responses.py; TGI's: api/tgi_protocol.py).

Fields we act on are declared. Any other field a client sends is refused with a 400 that
names it (`unsupported_field`), never silently ignored, unless it is `null`. Fields that
cannot change the answer (`user`, `metadata`, ...: `SamplingFields`) are declared with
OpenAI's types, checked, and otherwise ignored. Most optional fields accept an
explicit `null` as "not given", because several clients send one. OpenAI's own ranges
(temperature in [0, 2], penalties in [-2, 2], logit_bias in [-100, 100], top_logprobs in
[0, 20], n in [1, 128]) are checked here; what the engine itself can run (max_tokens >= 1,
0 < top_p <= 1, ...) is left to the backend, which names the bad value in an
`InvalidRequestError`, so those rules live in one place (`SamplingParams.validate`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    model_validator,
)
from pydantic_core import PydanticCustomError

from blitzscale.core.sampling import MAX_LOGPROBS

# A JSON number: no string ("0.5"), boolean or NaN / infinity stands in for one.
Number = Annotated[StrictFloat, Field(allow_inf_nan=False)]
_SURROGATE = re.compile("[\ud800-\udfff]")
_SCALARS = frozenset({int, float, bool, type(None)})

MAX_N = 128  # OpenAI's limit on choices per request
MAX_TOOLS = 128  # OpenAI's limit on a request's tools


def first_set_extra(extra: dict[str, Any] | None, unset: tuple[Any, ...] = (None,)) -> str | None:
    """The first undeclared field that asks for something: not one of the `unset` values
    (null; in messages also `[]`: clients echo back an assistant message with
    `"tool_calls": null, "annotations": []`)."""
    return next((k for k, v in (extra or {}).items() if v not in unset), None)


def omit_empty(body: dict[str, Any], *names: str) -> dict[str, Any]:
    """`body` without those of `names` that are empty (fields the APIs leave out then)."""
    for name in names:
        if not body.get(name):
            body.pop(name, None)
    return body


MESSAGE_UNSET = (None, [])  # what an echoed message's unused fields hold


def lone_surrogate(body: Any) -> tuple[str, str] | None:
    """(where, "U+XXXX") of the first text in a parsed JSON body, key or value, that holds
    a lone surrogate: JSON lets a client write one as an escape (`"\\ud800"`), but no UTF-8
    text carries it, so neither the tokenizer nor the messages to the workers could. A list of
    numbers alone (a prompt of token ids) is skipped without a Python loop over it."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, str):
            if (bad := _SURROGATE.search(node)) is not None:
                return where or "the body", f"U+{ord(bad.group()):04X}"
        elif isinstance(node, dict):
            for key, value in reversed(list(node.items())):
                name = str(key).encode("utf-8", "backslashreplace").decode()
                at = f"{where}.{name}" if where else name
                stack += [(at, value), (at, key)]
        elif isinstance(node, list) and not set(map(type, node)) <= _SCALARS:
            stack += [(f"{where}[{i}]", v) for i, v in reversed(list(enumerate(node)))]
    return None


class ApiRequest(BaseModel):
    """A request body: refused whole, naming the field, if any text in it is not Unicode
    (`lone_surrogate`; api/errors.py reports the `invalid_unicode` error's `path`)."""

    @model_validator(mode="before")
    @classmethod
    def _unicode_only(cls, data: Any) -> Any:
        if (found := lone_surrogate(data)) is not None:
            where, char = found
            raise PydanticCustomError(
                "invalid_unicode",
                "{path} is not valid Unicode: it holds a lone surrogate ({char})",
                {"path": where, "char": char},
            )
        return data


# --- OpenAI requests -------------------------------------------------------------------


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False  # vLLM's: every chunk carries its choice's usage so far
    # OpenAI pads chunks with random text unless told not to; this server never does, so
    # `false` (what its docs suggest sending) is what it gives, and `true` is refused
    include_obfuscation: StrictBool | None = None


class JsonSchemaFormat(BaseModel):
    """`response_format.json_schema`: OpenAI's shape. The schema is always enforced (as
    vLLM does), `strict` or not."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    """`{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}`; any other
    type is refused by name at the route (structured output: blitzscale/structured.py)."""

    model_config = ConfigDict(extra="forbid")

    type: str
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: one of its constraints (api/constraints.py)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    json_: dict[str, Any] | str | None = Field(None, alias="json")  # a JSON Schema, or its text
    regex: str | None = Field(None, min_length=1)
    choice: list[str] | None = Field(None, min_length=1)
    grammar: str | None = Field(None, min_length=1)  # EBNF (xgrammar's dialect, `root` first)
    json_object: StrictBool | None = None


class SamplingFields(ApiRequest):
    """What completions and chat completions share, including vLLM's `top_k`, `min_tokens`,
    `repetition_penalty`, `ignore_eos` and `stop_token_ids`, and `response_format` (vLLM
    takes it on completions too)."""

    model_config = ConfigDict(extra="allow")  # extras are refused by `unsupported_field`

    model: str | None = None
    max_tokens: StrictInt | None = None
    temperature: Number | None = Field(None, ge=0, le=2)
    top_p: Number | None = None
    top_k: StrictInt | None = None
    min_p: Number | None = None
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    n: StrictInt | None = Field(None, ge=1, le=MAX_N)
    presence_penalty: Number | None = Field(None, ge=-2, le=2)
    frequency_penalty: Number | None = Field(None, ge=-2, le=2)
    repetition_penalty: Number | None = Field(None, gt=0, le=2)
    logit_bias: dict[int, Number] | None = None  # token id (a string in JSON) -> bias
    min_tokens: StrictInt | None = Field(None, ge=0)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None  # vLLM's
    truncate_prompt_tokens: StrictInt | None = None  # vLLM's: keep the prompt's last k tokens
    # OpenAI's fields that change nothing a client gets back: typed as OpenAI has them, and
    # otherwise ignored
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: StrictBool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @property
    def num_choices(self) -> int:
        return self.n or 1

    def logit_bias_error(self) -> str | None:
        """OpenAI's range for a bias, [-100, 100] (the token ids are checked by the backend)."""
        for token, bias in (self.logit_bias or {}).items():
            if not -100 <= bias <= 100:
                return f"logit_bias[{token}] must be in [-100, 100], got {bias}"
        return None

    def extra_field(self) -> str | None:
        """The first undeclared field that could change the answer (not null)."""
        return first_set_extra(self.model_extra)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats

    def unsupported_field(self) -> str | None:
        """The first field asking for something this server does not do: refused with a 400
        rather than ignored, since ignoring it would change what the client gets."""
        return self.extra_field()

    @property
    def top_logprobs_asked(self) -> int | None:
        """Most likely tokens to report per position (None: no logprobs)."""
        return None


class CompletionRequest(SamplingFields):
    # a text; token ids; or a batch of one of either (batches of more are refused at the route)
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]  # (true is not a token id)
    echo: StrictBool = False
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: StrictInt | None = None
    suffix: str | None = None

    def unsupported_field(self) -> str | None:
        asked = {"suffix": bool(self.suffix), "best_of": self.best_of not in (None, 1)}
        return next((name for name, is_set in asked.items() if is_set), None) or self.extra_field()

    @property
    def top_logprobs_asked(self) -> int | None:
        return self.logprobs


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")  # set extras are refused at the route

    type: str
    text: str | None = None


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema of its arguments (an object)
    strict: StrictBool | None = None  # (the arguments always follow the schema when constrained)


class ToolDefinition(BaseModel):
    """One of `tools` (api/tools.py)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDefinition


class ToolChoiceFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str


class NamedToolChoice(BaseModel):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: ToolChoiceFunction


class FunctionCall(BaseModel):
    name: str
    arguments: str  # a JSON object's text


class ToolCall(BaseModel):
    """A call an assistant made: in a response, and in the messages a client sends back."""

    model_config = ConfigDict(extra="forbid")

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """A message; `content` may be null only for an assistant's with tool calls."""

    model_config = ConfigDict(extra="allow")  # set extras are refused at the route

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's
    tool_call_id: str | None = None  # a tool result's: the call it answers

    def unsupported_field(self) -> str | None:
        return first_set_extra(self.model_extra, unset=MESSAGE_UNSET)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None  # OpenAI's newer name for max_tokens; wins if both
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[ToolDefinition] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None  # false: "required" makes one call at most
    # vLLM's chat template options (api/chat_prompt.py)
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def top_logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


# --- tokenizer (vLLM's /tokenize and /detokenize) --------------------------------------


class TokenizeRequest(ApiRequest):
    """A text (`prompt`) or chat `messages` (rendered with the chat template)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ToolDefinition] | None = Field(None, max_length=MAX_TOOLS)  # with messages
    add_generation_prompt: StrictBool = True  # with messages (the template always adds it here)
    add_special_tokens: StrictBool = True


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(ApiRequest):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str
