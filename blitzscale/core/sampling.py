"""A request's sampling parameters and every check on their values (named in the 400)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from blitzscale.errors import InvalidRequestError

GRAMMAR_KINDS = ("json_object", "json_schema")  # response_format's types
# every kind a grammar may be: also vLLM's `structured_outputs` regex and grammar (EBNF)
CONSTRAINT_KINDS = (*GRAMMAR_KINDS, "regex", "ebnf")


@dataclass(frozen=True)
class Grammar:
    """Structured output (`response_format`, `structured_outputs`, TGI's `grammar`): what the
    output must spell. The engine masks every token the grammar does not allow
    (blitzscale/structured.py, xgrammar) and ends the output where the grammar ends."""

    kind: str  # "json_object": any JSON object; "json_schema": a JSON value valid against
    # `schema`; "regex": text matching `schema` whole; "ebnf": text of the grammar `schema`
    schema: str = ""  # the JSON Schema as JSON text (its key order kept), the regex or the EBNF

    def validate(self) -> None:
        """The checks that need no grammar library (compiling is structured.py's)."""
        if self.kind not in CONSTRAINT_KINDS:
            raise InvalidRequestError(
                f"response_format type must be one of {', '.join(GRAMMAR_KINDS)} or text, got {self.kind!r}",
                "response_format",
            )
        if self.kind in ("regex", "ebnf"):
            if not self.schema:
                raise InvalidRequestError(f"the {self.kind} is empty", "response_format")
            return
        if self.kind == "json_object":
            if self.schema:
                raise InvalidRequestError("a json_object response_format takes no schema", "response_format")
            return
        try:
            schema = json.loads(self.schema)
        except (TypeError, ValueError) as e:
            raise InvalidRequestError(f"the json_schema's schema is not JSON: {e}", "response_format") from e
        if not isinstance(schema, dict | bool):
            raise InvalidRequestError(
                f"the json_schema's schema must be a JSON object, got {type(schema).__name__}",
                "response_format",
            )


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    # vLLM's and SGLang's: after temperature, tokens whose probability is below min_p times
    # the most likely token's are cut (before top-k and top-p, as vLLM applies them); 0: off
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # vLLM's and OpenAI's logits processors (engine/logits.py), in the order they apply:
    min_tokens: int = 0  # EOS and stop_token_ids are held back (and stops ignored) until then
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    repetition_penalty: float = 1.0  # HF/vLLM: divides positive logits of seen tokens (prompt + output)
    frequency_penalty: float = 0.0  # OpenAI: minus penalty x count in the output
    presence_penalty: float = 0.0  # OpenAI: minus penalty once a token is in the output
    logprobs: int | None = None  # per token: its log-probability and the `logprobs` most likely
    # per prompt token after the first: its log-probability given the tokens before it, and
    # the `prompt_logprobs` most likely there (vLLM's field; the prompt is computed whole,
    # no cached prefix taken, so every position has its logits)
    prompt_logprobs: int | None = None
    grammar: Grammar | None = None  # structured output: tokens the grammar refuses are masked

    def validate(self) -> None:
        """Refuse any value the engine cannot run or a message cannot carry, by name."""
        _check_int("max_tokens", self.max_tokens, 1, INT32_LIMIT)
        _check_float("temperature", self.temperature, 0.0, "be >= 0")
        if not 0 < self.top_p <= 1:  # also false for NaN
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        _check_int("top_k", self.top_k, -1, INT32_LIMIT, "be -1, 0 (off) or positive")
        if not 0 <= self.min_p <= 1:  # also false for NaN
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p}", "min_p")
        if self.seed is not None:
            _check_int("seed", self.seed, 0, INT64_LIMIT)
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t, 0, INT32_LIMIT)
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop strings must not be empty", "stop")
        self._validate_processors()
        if self.grammar is not None:
            if not isinstance(self.grammar, Grammar):
                raise InvalidRequestError(f"grammar must be a Grammar, got {self.grammar!r}", "grammar")
            self.grammar.validate()
            if self.min_tokens:  # (the grammar allows only EOS once it is complete)
                raise InvalidRequestError(
                    "min_tokens cannot be combined with response_format: the grammar decides where the "
                    "output ends",
                    "min_tokens",
                )

    def _validate_processors(self) -> None:
        """What the engine can run (the HTTP API checks OpenAI's narrower ranges first)."""
        _check_int("min_tokens", self.min_tokens, 0, INT32_LIMIT)
        if self.min_tokens > self.max_tokens:
            raise InvalidRequestError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})", "min_tokens"
            )
        for token, bias in self.logit_bias:
            _check_int("logit_bias token id", token, 0, INT32_LIMIT)
            _check_float(f"logit_bias[{token}]", bias, -math.inf, "be a number")
        rp = self.repetition_penalty
        _check_float("repetition_penalty", rp, 0.0, "be > 0")
        if rp == 0:
            raise InvalidRequestError(
                "repetition_penalty must be > 0 and finite, got 0", "repetition_penalty"
            )
        _check_float("frequency_penalty", self.frequency_penalty, -math.inf, "be a number")
        _check_float("presence_penalty", self.presence_penalty, -math.inf, "be a number")
        for name in ("logprobs", "prompt_logprobs"):
            if (value := getattr(self, name)) is not None:
                _check_int(name, value, 0, MAX_LOGPROBS + 1, f"be in [0, {MAX_LOGPROBS}]")

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0 or self.presence_penalty != 0

    @property
    def processes_logits(self) -> bool:
        """Does any logits processor change this request's logits (engine/logits.py)?"""
        return bool(self.has_penalties or self.logit_bias or self.min_tokens)

    @property
    def reads_every_step(self) -> bool:
        """Its sampling reads its own token history (a grammar's state too), or the host reads
        its logprobs, every step: it never overlaps (engine/overlap.py), so no token of it is
        ever pending."""
        return self.processes_logits or self.logprobs is not None or self.grammar is not None

    @property
    def is_greedy(self) -> bool:
        """Temperatures below GREEDY_BELOW sample as greedy (dividing logits by them
        overflows to inf, which no distribution survives); vLLM does the same."""
        return self.temperature < GREEDY_BELOW or self.top_k == 1


GREEDY_BELOW = 1e-5
MAX_LOGPROBS = 20  # most likely tokens reported per position (vLLM's default max_logprobs)
INT32_LIMIT = 2**31  # counts and token ids
INT64_LIMIT = 2**63  # seeds (they travel as msgpack int64)


def _param(name: str) -> str:
    """The request field a check's name is about ("logit_bias[5]" -> "logit_bias")."""
    return name.split("[")[0].split(" ")[0]


def _check_int(name: str, value: object, lo: int, hi: int, must: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{name} must be an integer, got {value!r}", _param(name))
    if value < lo:
        raise InvalidRequestError(f"{name} must {must or f'be at least {lo}'}, got {value}", _param(name))
    if value >= hi:
        raise InvalidRequestError(f"{name} must be below {hi}, got {value}", _param(name))


def _check_float(name: str, value: object, lo: float, must: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(f"{name} must be a number, got {value!r}", _param(name))
    if not (math.isfinite(value) and value >= lo):
        raise InvalidRequestError(f"{name} must {must} and finite, got {value}", _param(name))
