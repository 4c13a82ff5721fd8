"""The models a router serves, and one model's face towards the HTTP edge.

Each request names its model (`model` in the body; none: the first, the default one);
`ModelBackend` is the `ServingBackend` of one model: its tokenizer, vocabulary and
context, and `generate` tagged with its name (through `RequestRouter`, the few router
operations it calls). Instances belong to models in `ControlState`; copies of weights in
the ParameterPool, by model name.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from blitzscale.control.costmodel import Profile
from blitzscale.core.chat import ChatOptions, render_chat
from blitzscale.core.outputs import RequestOutput
from blitzscale.core.sampling import Grammar, SamplingParams
from blitzscale.core.validate import validate_request
from blitzscale.errors import InvalidRequestError


@dataclass(frozen=True)
class ServedModel:
    name: str  # what requests call it (the pool's key for its copies)
    tokenizer: Any
    vocab_size: int
    max_model_len: int
    root: str | None = None  # the checkpoint's Hugging Face id, where known
    may_idle_at_zero: bool = False  # with no instance it is at zero (/health ok), not broken
    cost: Profile | None = None  # its cost model on the workers' device (None: unknown)
    max_num_seqs: int = 0  # sequences one of its engines runs at once (0: unknown)
    # its engines' KV block size when they cache prompt prefixes (0: they do not, and the
    # router does not route by prefix; serve/prefixes.py)
    prefix_block_size: int = 0
    ttft_slo_s: float = 0.0  # its time-to-first-token SLO (0: none), which live splits plan for


@dataclass(frozen=True)
class ScaledModel:
    """What the scaler needs of one model."""

    name: str
    source: str  # a spec every worker resolves (tokenizer, config)
    disk_source: str  # our-format folder for disk loads
    min_instances: int = 0  # 0: it may scale to zero (with a finite keep-alive)
    max_instances: int = 0  # 0: no bound
    keep_alive_s: float = math.inf  # no request this long: to zero (inf: never)
    ttft_slo_s: float = 0.0  # its time-to-first-token SLO, which sets the planner's band (0: none)


class RequestRouter(Protocol):
    """What a model's backend uses of the router that serves it."""

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        model: str | None = None,
        stream: bool = True,
    ) -> AsyncIterator[RequestOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    def health(self) -> dict[str, Any]: ...

    def queue_time_s(self, request_id: str) -> float | None: ...


class ModelBackend:
    """One model of the router, as the HTTP edge sees it (api/backend.py)."""

    def __init__(self, router: RequestRouter, model: ServedModel) -> None:
        self.router = router
        self.model = model
        self._grammars: Any = None  # structured.Grammars for its tokenizer (xgrammar on first use)

    @property
    def model_name(self) -> str:
        return self.model.name

    @property
    def max_model_len(self) -> int:
        return self.model.max_model_len

    @property
    def model_root(self) -> str | None:
        return self.model.root

    def encode(self, text: str) -> list[int]:
        tok = self.model.tokenizer
        if tok is None:
            raise InvalidRequestError("this model has no tokenizer: send token ids")
        return list(tok(text).input_ids)

    def decode(self, token_ids: list[int]) -> str:
        tok = self.model.tokenizer
        if tok is None:
            raise InvalidRequestError("this model has no tokenizer")
        vocab = self.model.vocab_size
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"token {bad} is outside the vocabulary [0, {vocab})", "tokens")
        return str(tok.decode(token_ids))

    def chat_template(self) -> str | None:
        template = getattr(self.model.tokenizer, "chat_template", None)
        return template if isinstance(template, str) else None

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: ChatOptions | None = None,
    ) -> list[int]:
        tok = self.model.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            raise InvalidRequestError("this model has no chat template")
        try:
            return render_chat(tok, messages, tools, options)
        except Exception as e:  # jinja errors on malformed messages
            raise InvalidRequestError(f"messages do not fit the chat template: {e}") from e

    def check_grammar(self, grammar: Grammar) -> None:
        """Compile a request's grammar for this model's tokenizer (cached); InvalidRequestError
        with the library's message if it cannot be (the HTTP edge calls it off the loop)."""
        if self._grammars is None:
            from blitzscale.structured import Grammars

            tok = self.model.tokenizer
            eos = getattr(tok, "eos_token_id", None)
            self._grammars = Grammars(tok, self.model.vocab_size, [] if eos is None else [eos])
        self._grammars.compile(grammar)

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """InvalidRequestError, naming the bad value, for a request this model cannot run
        (what `generate` checks first; the HTTP edge checks a batch's prompts before any runs)."""
        validate_request(prompt_token_ids, params, self.model.vocab_size, self.model.max_model_len)

    def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, stream: bool = True
    ) -> AsyncIterator[RequestOutput]:
        return self.router.generate(
            request_id, prompt_token_ids, params, model=self.model.name, stream=stream
        )

    async def abort(self, request_id: str) -> None:
        await self.router.abort(request_id)

    def health(self) -> dict[str, Any]:
        return self.router.health()

    def queue_time_s(self, request_id: str) -> float | None:
        return self.router.queue_time_s(request_id)
