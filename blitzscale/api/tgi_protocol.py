"""Bodies of TGI's HTTP API (`/generate`, `/generate_stream`, `POST /`, `/info`), validated
by pydantic. Every field a client sends is declared: TGI's knobs this server lacks are
refused by name when set (`TgiParameters.unsupported_field`), anything else is refused by
pydantic, and numbers and flags take no string or boolean stand-ins.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    model_serializer,
)

from blitzscale.api.protocol import ApiRequest, Number, omit_empty
from blitzscale.core.sampling import MAX_LOGPROBS

TGI_DEFAULT_MAX_NEW_TOKENS = 100  # TGI's documented default
TgiFinishReason = Literal["length", "eos_token", "stop_sequence"]


class TgiParameters(BaseModel):
    """TGI samples when `do_sample` is set or any of temperature/top_p/top_k changes the
    distribution; otherwise it decodes greedily. `ignore_eos` is our extension."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: StrictInt | None = None
    seed: StrictInt | None = None
    stop: list[str] | str | None = None
    do_sample: StrictBool = False
    details: StrictBool = False
    decoder_input_details: StrictBool = False  # details.prefill: the prompt's tokens
    return_full_text: StrictBool = False
    ignore_eos: StrictBool = False
    repetition_penalty: Number | None = Field(None, gt=0)
    frequency_penalty: Number | None = Field(None, ge=-2, le=2)
    # {"type": "json", "value": a JSON Schema} or {"type": "regex", "value": a pattern}
    grammar: dict[str, Any] | None = None
    truncate: StrictInt | None = None  # keep the input's last this many tokens
    top_n_tokens: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)  # each token's alternatives
    # TGI's knobs this server does not have: refused when set, never ignored
    watermark: StrictBool = False
    typical_p: Number | None = None
    best_of: StrictInt | None = None
    adapter_id: str | None = None

    def unsupported_field(self) -> str | None:
        asked = {"watermark": self.watermark, "best_of": self.best_of not in (None, 1)}
        for name in ("typical_p", "adapter_id"):
            asked[name] = getattr(self, name) is not None
        return next((name for name, is_set in asked.items() if is_set), None)

    @property
    def wants_details(self) -> bool:
        """TGI answers `details` when either is set (prefill lives in details)."""
        return self.details or self.decoder_input_details

    @property
    def is_sampling(self) -> bool:
        changes = (
            self.temperature not in (None, 1.0)
            or self.top_p not in (None, 1.0)
            or self.top_k not in (None, 0, -1)
        )
        return self.do_sample or changes


class TgiRequest(ApiRequest):
    model_config = ConfigDict(extra="forbid")

    inputs: str
    parameters: TgiParameters = Field(default_factory=TgiParameters)
    stream: StrictBool | None = None  # (huggingface_hub sends it: it must name the route's kind)
    add_special_tokens: StrictBool = True  # (TGI 2's; the tokenizer's special tokens: refused off)


class TgiToken(BaseModel):
    id: int
    text: str
    logprob: float | None = None
    special: bool = False


class TgiTimings(BaseModel):
    """The `x-*-time` headers of the response, in milliseconds, for clients that read the
    final stream event rather than headers (a stream's headers go out before its end)."""

    queue_time: int | None = None
    first_token_time: int | None = None
    total_time: int | None = None
    inference_time: int | None = None
    max_time_between_tokens: int | None = None
    avg_time_between_tokens: int | None = None
    p99_time_between_tokens: int | None = None
    output_length: int


class TgiPrefillToken(BaseModel):
    id: int
    text: str
    logprob: float | None = None  # (the first prompt token's: none)


class TgiDetails(BaseModel):
    finish_reason: TgiFinishReason
    generated_tokens: int
    input_length: int
    seed: int | None = None
    prefill: list[TgiPrefillToken] = []  # with decoder_input_details
    tokens: list[TgiToken] = []  # every generated token, with its logprob
    top_tokens: list[list[TgiToken]] = []  # with top_n_tokens: each token's alternatives
    timings: TgiTimings

    @model_serializer(mode="wrap")
    def _omit_no_top_tokens(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return omit_empty(handler(self), "top_tokens")


class TgiInfo(BaseModel):
    """TGI's `/info`, with the fields its clients read."""

    model_id: str
    model_sha: str | None = None
    model_dtype: str | None = None
    model_device_type: str | None = None
    model_pipeline_tag: str | None = "text-generation"
    max_concurrent_requests: int | None = None
    max_best_of: int = 1
    max_stop_sequences: int | None = None
    max_input_tokens: int
    max_total_tokens: int
    max_input_length: int  # (TGI's older name of max_input_tokens)
    validation_workers: int = 1
    max_client_batch_size: int = 1
    router: str = "blitzscale"
    version: str
    sha: str | None = None
    docker_label: str | None = None


class TgiResponse(BaseModel):
    generated_text: str
    details: TgiDetails | None = None


class TgiStreamEvent(BaseModel):
    index: int
    token: TgiToken
    generated_text: str | None = None  # set on the last event only
    details: TgiDetails | None = None  # set on the last event only
    top_tokens: list[TgiToken] = []  # with top_n_tokens: this token's alternatives

    @model_serializer(mode="wrap")
    def _omit_no_top_tokens(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return omit_empty(handler(self), "top_tokens")
