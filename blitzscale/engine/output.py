"""Stop conditions and incremental detokenization of a request's new tokens."""

from __future__ import annotations

from typing import Any

from blitzscale.core.outputs import RequestOutput
from blitzscale.engine.request import Request


class OutputProcessor:
    def __init__(self, tokenizer: Any | None, eos_token_ids: set[int], max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len

    def check_stop(self, req: Request) -> str | None:
        """The finish reason once `req` just got a token, or None to go on."""
        p = req.params
        last = req.token_ids[-1]
        before = len(req.text)
        self._update_text(req)
        if req.num_output_tokens < p.min_tokens:  # (EOS and stop ids were held back too)
            return "length" if req.num_tokens >= self.max_model_len else None
        if (not p.ignore_eos and last in self.eos_token_ids) or last in p.stop_token_ids:
            return "stop"
        if p.stop and self._find_stop(req, before):
            return "stop"
        if req.num_output_tokens >= p.max_tokens or req.num_tokens >= self.max_model_len:
            return "length"
        return None

    def check_stop_text(self, req: Request) -> None:
        """Bring a request's text up to date with its tokens (e.g. after an import)."""
        self._update_text(req)

    def make_output(self, req: Request) -> RequestOutput:
        new_ids = req.output_token_ids[req.num_emitted_tokens :]
        visible = len(req.text)
        if not req.is_finished:
            if req.text.endswith("\ufffd"):  # a multi-byte character is still incomplete
                visible -= 1
            if req.params.stop:  # a stop string may still be forming at the end
                visible -= max(len(s) for s in req.params.stop) - 1
        visible = max(visible, req.num_emitted_chars)
        delta = req.text[req.num_emitted_chars : visible]
        req.num_emitted_tokens = req.num_output_tokens
        req.num_emitted_chars = visible
        logprobs, req.logprobs = tuple(req.logprobs), []
        prompt_logprobs, req.prompt_logprobs = tuple(req.prompt_logprobs), []
        return RequestOutput(
            request_id=req.request_id,
            new_token_ids=new_ids,
            token_ids=req.output_token_ids,
            text_delta=delta,
            text=req.text[:visible],
            finished=req.is_finished,
            finish_reason=req.finish_reason,
            num_prompt_tokens=req.num_prompt_tokens,
            live_layers=req.live_layers,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )

    def _update_text(self, req: Request) -> None:
        if self.tokenizer is not None:
            req.text = self.tokenizer.decode(req.output_token_ids, skip_special_tokens=True)

    def _find_stop(self, req: Request, before: int) -> bool:
        """Cut the text at the first stop string that appeared since `before` chars."""
        longest = max(len(s) for s in req.params.stop)
        search_from = max(0, before - longest)
        hits = [i for s in req.params.stop if (i := req.text.find(s, search_from)) >= 0]
        if hits:
            req.text = req.text[: min(hits)]
            return True
        return False
