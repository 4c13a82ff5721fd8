"""Structured output inside the engine: each sampled request's grammar matcher and the
step's token mask (the grammars themselves: blitzscale/structured.py).

A request gets its matcher where it is first sampled, from the tokens it already has (it
may have been prefilled, or begun, on another instance: PD migration, relays and recompute
need nothing more). xgrammar is imported by the first request that asks for a grammar.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from blitzscale.core.sampling import Grammar
from blitzscale.engine.request import Request
from blitzscale.engine.sampler import TokenMask
from blitzscale.errors import InvalidRequestError


class GrammarMasks:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Iterable[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # the logits' width
        self.stop_token_ids = list(stop_token_ids)
        self._grammars: Any = None  # structured.Grammars, made on first use

    @property
    def grammars(self) -> Any:
        if self._grammars is None:
            from blitzscale.structured import Grammars

            self._grammars = Grammars(self.tokenizer, self.vocab_size, self.stop_token_ids)
        return self._grammars

    def check(self, grammar: Grammar) -> None:
        """InvalidRequestError, with the library's message, for a grammar that does not
        compile (compiled once: the sampling side finds it cached)."""
        self.grammars.compile(grammar)

    def attach(self, sampling: list[Request]) -> dict[int, str]:
        """A matcher for every row with a grammar and none yet; the rows whose grammar
        cannot be rebuilt from their tokens, with why (they fail alone)."""
        failed = {}
        for i, r in enumerate(sampling):
            if r.params.grammar is not None and r.matcher is None:
                try:
                    r.matcher = self.grammars.matcher(r.params.grammar, r.output_token_ids)
                except InvalidRequestError as e:
                    failed[i] = str(e)
        return failed

    def mask(self, sampling: list[Request], width: int) -> TokenMask | None:
        """The tokens each row's grammar allows next, filled on the host (on CUDA while the
        device still computes the logits); None when no row has a matcher."""
        rows = [i for i, r in enumerate(sampling) if r.matcher is not None]
        if not rows:
            return None
        from blitzscale.structured import allocate_bitmask, fill_bitmask

        bitmask = allocate_bitmask(len(sampling), width)
        fill_bitmask([sampling[i].matcher for i in rows], bitmask, rows)
        return TokenMask(bitmask, rows)
