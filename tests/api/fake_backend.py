"""A deterministic in-process `ServingBackend` for the API tests.

Every character is one token (its code point), and the output echoes the prompt's tokens
from the start, over and over (or gives `reply`). `#` is the EOS token (not part of the text, like a special
token). Validation follows the real engine: bad sampling values, an empty prompt and a prompt
that leaves no room for one generated token raise `InvalidRequestError` on the first
`__anext__`. Stop strings are held back and cut as the engine's output processor does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from blitzscale.core.chat import ChatOptions
from blitzscale.core.outputs import RequestOutput, TokenLogprob
from blitzscale.core.sampling import SamplingParams
from blitzscale.errors import InvalidRequestError

EOS = "#"


@dataclass(frozen=True)
class Call:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool = True  # what the route told the backend: the client reads deltas


@dataclass
class FakeBackend:
    model_name: str = "fake-model"
    max_model_len: int = 128
    token_delay_s: float = 0.0  # sleep before each output
    tokens_per_output: int = 1  # >1 imitates a backend that batches tokens into one output
    hold: bool = False  # produce nothing, as if queued forever (for disconnect tests)
    fail_after: int | None = None  # raise RuntimeError after this many outputs
    # A request whose client reads only the whole answer gives this many outputs of "X",
    # then runs again (`restarted`), as the router does when its instance dies under it.
    restart_after: int | None = None
    reply: str | None = None  # the text every request generates (then EOS) instead of the echo
    # what `chat_template()` says the template is (encode_chat renders as its docstring says)
    template: str = "{{ mood }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    calls: list[Call] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    running: set[str] = field(default_factory=set)  # started, not finished, not cancelled
    resets: int = 0  # POST /reset_prefix_cache calls
    num_outputs: int = 0  # outputs produced, all requests

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: list[int]) -> str:
        return "".join(chr(t) for t in token_ids)

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: ChatOptions | None = None,
    ) -> list[int]:
        """A template that renders no tools (the server writes them into the messages) and
        reads one variable, `mood` (shown first)."""
        rendered = "".join(
            f"<{m['role']}{' ' + m['name'] if 'name' in m else ''}>{m['content']}\n" for m in messages
        )
        o = options or ChatOptions()
        if o.continue_final_message:
            rendered = rendered.removesuffix("\n")
        if (mood := o.template_kwargs.get("mood")) is not None:
            rendered = f"[{mood}]" + rendered
        return self.encode(rendered + ("<assistant>" if o.add_generation_prompt else ""))

    def chat_template(self) -> str:
        return self.template

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.model_name}

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def reset_prefix_cache(self) -> int:
        self.resets += 1
        return 1

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        params.validate()
        n = len(prompt_token_ids)
        if n == 0:
            raise InvalidRequestError("prompt is empty")
        if n >= self.max_model_len:
            raise InvalidRequestError(
                f"prompt has {n} tokens but the context is {self.max_model_len} tokens "
                "(prompt plus at least one generated token must fit)"
            )

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, stream: bool = True
    ) -> AsyncIterator[RequestOutput]:
        self.validate(prompt_token_ids, params)
        self.calls.append(Call(request_id, list(prompt_token_ids), params, stream))
        self.running.add(request_id)
        try:
            n = len(prompt_token_ids)
            if self.restart_after is not None and not stream:
                x, lp = ord("X"), (TokenLogprob(-9.0),) if params.logprobs is not None else ()
                for i in range(1, self.restart_after + 1):
                    yield RequestOutput(request_id, [x], [x] * i, "X", "X" * i, False, None, n, logprobs=lp)
                yield RequestOutput(request_id, [], [], "", "", False, None, n, restarted=True)
            async for out in self._outputs(request_id, prompt_token_ids, params):
                yield out
        finally:
            self.running.discard(request_id)

    async def _outputs(
        self, request_id: str, prompt: list[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        if self.hold:
            await asyncio.Event().wait()  # until cancelled
        source = prompt if self.reply is None else self.encode(self.reply + EOS)
        ids: list[int] = []
        text, emitted = "", 0
        hold_back = max((len(s) for s in params.stop), default=1) - 1
        num_outputs = 0
        while True:
            await asyncio.sleep(self.token_delay_s)
            new: list[int] = []
            reason = None
            for _ in range(self.tokens_per_output):
                token = source[len(ids) % len(source)]
                ids.append(token)
                new.append(token)
                text, reason = self._after_token(token, text, len(prompt) + len(ids), len(ids), params)
                if reason is not None:
                    break
            visible = len(text) if reason else max(len(text) - hold_back, emitted)
            delta, emitted = text[emitted:visible], visible
            k = params.logprobs or 0  # (the top k: the token itself, then the next code points)
            top = [tuple((t + j, -0.5 - j) for j in range(k)) for t in new]
            lps = tuple(TokenLogprob(-0.5, tops) for tops in top) if params.logprobs is not None else ()
            yield RequestOutput(
                request_id,
                new,
                list(ids),
                delta,
                text[:visible],
                reason is not None,
                reason,
                len(prompt),
                logprobs=lps,
            )
            num_outputs += 1
            self.num_outputs += 1
            if reason is not None:
                return
            if self.fail_after is not None and num_outputs >= self.fail_after:
                raise RuntimeError("fake backend failure")

    def _after_token(
        self, token: int, text: str, num_tokens: int, num_output: int, params: SamplingParams
    ) -> tuple[str, str | None]:
        if chr(token) == EOS and not params.ignore_eos:
            return text, "stop"
        text += chr(token)
        hits = [i for s in params.stop if (i := text.find(s)) >= 0]
        if hits:
            return text[: min(hits)], "stop"
        if num_output >= params.max_tokens or num_tokens >= self.max_model_len:
            return text, "length"
        return text, None
