"""Structured output (`response_format`, `structured_outputs`, TGI's `grammar`): grammars
compiled by xgrammar, and each request's matcher.

xgrammar (and with it torch) is imported only when a request asks for structured output, so
importing this module costs nothing. A `Grammars` belongs to one tokenizer (the HTTP edge's
model, an engine): it compiles a request's `Grammar` (cached by xgrammar per grammar text;
an error is an InvalidRequestError naming the library's complaint, the HTTP 400) and makes
matchers. A `Matcher` is one request's grammar state: it is owned by the engine's request
(engine/request.py), made on the instance that samples the request by replaying the output
tokens it already has (so a request that migrated, was relayed or recomputed continues where
it stopped), and advanced by each token accepted.

Output is compact JSON (no whitespace beyond ", " and ": "): a small model left free to
choose whitespace can emit it for ever. `json_object` is any JSON object; `json_schema` is
compiled in strict mode (no properties or items beyond the schema's), whatever the request's
`strict` says, as vLLM does. A regex must match the whole output; an EBNF grammar is
xgrammar's dialect (GBNF's, with `root` as its start).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from blitzscale.core.sampling import Grammar
from blitzscale.errors import InvalidRequestError
from blitzscale.schema_support import unsupported

if TYPE_CHECKING:
    import torch

# xgrammar's errors start with its log prefix: "[12:02:44] /project/cpp/file.cc:94: "
_LOG_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*")
JSON_OBJECT_SCHEMA = '{"type": "object"}'
# String characters as xgrammar 0.2.9 writes them (EBNF text): with minLength / maxLength
# its class lets raw control characters (U+0000-U+001F but CR, LF) through, and every
# class lets UTF-8-encoded surrogates (U+D800-U+DFFF: bytes no UTF-8 decoder accepts)
# through; neither is JSON. `_compile_schema` swaps both for JSON's characters.
_LENGTH_CHARS = r"[^\"\\\r\n]"
_STRING_CHARS = r"[^\0-\x1f\"\\\r\n]"
_JSON_CHARS = r"[^\0-\x1f\"\\\r\n\uD800-\uDFFF]"
COMPILED_KEPT = 256  # compiled grammars an owner keeps at hand (xgrammar caches them too)
CACHE_LIMIT_BYTES = 256 << 20  # compiled grammars kept per tokenizer


def _xgr() -> Any:
    """xgrammar, imported on first use. Its FFI layer would JIT-compile a torch extension
    (a C++ build in a subprocess) on a torch without the DLPack exchange API; we need none of
    what that enables, so it is off unless the environment says otherwise."""
    os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
    import xgrammar

    return xgrammar


def library_message(err: BaseException) -> str:
    """xgrammar's complaint without its log prefix, on one line."""
    text = _LOG_PREFIX.sub("", str(err).strip())
    return " ".join(text.split()) or type(err).__name__


class Grammars:
    """Compiles grammars for one tokenizer and makes matchers of them (thread-safe: the HTTP
    edge compiles on worker threads). `vocab_size` is the model's logits width (it may be
    larger than the tokenizer's vocabulary: padding); `stop_token_ids` end the grammar."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Iterable[int]) -> None:
        if tokenizer is None:
            raise InvalidRequestError(
                "response_format needs the model's tokenizer, and this model has none", "response_format"
            )
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(set(stop_token_ids))
        self._compiler: Any = None
        self._lock = threading.Lock()
        self._compiled: OrderedDict[Grammar, Any] = OrderedDict()  # most recently used last

    def _xgr_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                xgr = _xgr()
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
                )
                self._compiler = xgr.GrammarCompiler(
                    info, max_threads=2, cache_enabled=True, cache_limit_bytes=CACHE_LIMIT_BYTES
                )
            return self._compiler

    def compile(self, grammar: Grammar) -> Any:
        """xgrammar's CompiledGrammar (cached); InvalidRequestError (param response_format)
        with the library's message for a schema it cannot compile."""
        with self._lock:
            if (hit := self._compiled.get(grammar)) is not None:
                self._compiled.move_to_end(grammar)
                return hit
        grammar.validate()
        compiler = self._xgr_compiler()
        try:
            if grammar.kind == "regex":
                compiled = compiler.compile_regex(grammar.schema)
            elif grammar.kind == "ebnf":
                compiled = compiler.compile_grammar(grammar.schema)
            else:
                schema = grammar.schema if grammar.kind == "json_schema" else JSON_OBJECT_SCHEMA
                if (problem := unsupported(json.loads(schema))) is not None:
                    raise InvalidRequestError(f"response_format: {problem}", "response_format")
                compiled = _compile_schema(compiler, schema, strict=grammar.kind == "json_schema")
        except (RuntimeError, ValueError, TypeError) as e:
            if isinstance(e, InvalidRequestError):
                raise
            what = "schema" if grammar.kind.startswith("json") else grammar.kind
            raise InvalidRequestError(
                f"response_format: the {what} cannot be compiled: {library_message(e)}", "response_format"
            ) from e
        with self._lock:
            self._compiled[grammar] = compiled
            while len(self._compiled) > COMPILED_KEPT:
                self._compiled.popitem(last=False)
        return compiled

    def matcher(self, grammar: Grammar, output_token_ids: Iterable[int] = ()) -> Matcher:
        """A fresh matcher of `grammar`, advanced over `output_token_ids` (the tokens the
        request already has); InvalidRequestError if the grammar refuses one of them."""
        m = Matcher(_xgr().GrammarMatcher(self.compile(grammar)))
        for i, tok in enumerate(output_token_ids):
            if not m.accept(tok):
                raise InvalidRequestError(f"output token {tok} at position {i} does not fit the grammar")
        return m


def _compile_schema(compiler: Any, schema: str, strict: bool) -> Any:
    """The schema's grammar, compact, through its EBNF text with every string's characters
    made JSON's (see _LENGTH_CHARS)."""
    xgr = _xgr()
    ebnf = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=strict))
    ebnf = ebnf.replace(_LENGTH_CHARS, _JSON_CHARS).replace(_STRING_CHARS, _JSON_CHARS)
    return compiler.compile_grammar(ebnf)


class Matcher:
    """One request's grammar state."""

    def __init__(self, handle: Any) -> None:
        self._m = handle

    def accept(self, token: int) -> bool:
        """Advance by `token`; False (and no change) if the grammar does not allow it."""
        return bool(self._m.accept_token(token))

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted: the output ends."""
        return bool(self._m.is_terminated())

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into `bitmask[row]` (int32, on the host)."""
        self._m.fill_next_token_bitmask(bitmask, row)


ROWS_PER_THREAD = 8  # a batch's mask is filled on one thread per this many rows (at most FILL_THREADS)
FILL_THREADS = max(1, min(8, (os.cpu_count() or 2) // 2))
_batch_fillers: dict[int, Any] = {}


def fill_bitmask(matchers: list[Matcher], bitmask: torch.Tensor, rows: list[int]) -> None:
    """Each matcher's allowed tokens into its row of `bitmask` (host, int32): a few rows on
    this thread, more on several threads at once (xgrammar's batch matcher, without the
    GIL: 39 us a row on an H200's host, 2.5 ms for 64 rows on one thread)."""
    threads = min(FILL_THREADS, len(matchers) // ROWS_PER_THREAD)
    if threads <= 1:
        for m, row in zip(matchers, rows, strict=True):
            m.fill(bitmask, row)
        return
    if (batch := _batch_fillers.get(threads)) is None:
        batch = _batch_fillers[threads] = _xgr().BatchGrammarMatcher(max_threads=threads)
    batch.batch_fill_next_token_bitmask([m._m for m in matchers], bitmask, rows)


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """A host bitmask for `rows` rows (one bit per token, all allowed)."""
    return _xgr().allocate_token_bitmask(rows, vocab_size)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Set to -inf, in place, every logit of `rows` whose bit in `bitmask` (host, one row
    per logits row) is 0. On CUDA the bitmask goes up by one asynchronous copy and
    xgrammar's Triton kernel applies it; on CPU its C++ kernel."""
    if logits.device.type == "cuda":
        bitmask = bitmask.pin_memory().to(logits.device, non_blocking=True)
    indices = None if len(rows) == logits.shape[0] else rows
    _xgr().apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1], indices=indices)
