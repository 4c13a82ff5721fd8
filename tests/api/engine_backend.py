"""A minimal `ServingBackend` over one real `LLMEngine`, for end-to-end tests of the API.

One asyncio task owns the engine: it applies queued submissions and aborts between steps and
runs each `step()` in a worker thread (a step is blocking CPU work; the event loop must stay
free to serve HTTP). Nothing else touches the engine while this backend runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from blitzscale.core.chat import ChatOptions, render_chat
from blitzscale.core.outputs import RequestOutput
from blitzscale.core.sampling import SamplingParams
from blitzscale.engine.engine import LLMEngine


class EngineBackend:
    def __init__(self, engine: LLMEngine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name
        self.max_model_len = engine.max_model_len
        self._streams: dict[str, asyncio.Queue[RequestOutput]] = {}
        self._pending: list[Callable[[], object]] = []  # engine calls to run between steps
        self._wake = asyncio.Event()

    @classmethod
    @asynccontextmanager
    async def running(cls, engine: LLMEngine, model_name: str) -> AsyncIterator[EngineBackend]:
        """The backend with its stepping task alive for the duration of the block."""
        backend = cls(engine, model_name)
        task = asyncio.create_task(backend._run())
        try:
            yield backend
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def encode(self, text: str) -> list[int]:
        return list(self.engine.tokenizer(text).input_ids)

    def decode(self, token_ids: list[int]) -> str:
        return str(self.engine.tokenizer.decode(token_ids))

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: ChatOptions | None = None,
    ) -> list[int]:
        return render_chat(self.engine.tokenizer, messages, tools, options)

    def chat_template(self) -> str | None:
        template = getattr(self.engine.tokenizer, "chat_template", None)
        return template if isinstance(template, str) else None

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.model_name, "running": len(self._streams)}

    async def reset_prefix_cache(self) -> int:
        self.engine.reset_prefix_cache()
        return 1

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.engine.validate(prompt_token_ids, params)

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, stream: bool = True
    ) -> AsyncIterator[RequestOutput]:
        """(`stream`: one engine in this process never runs a request again, whatever it is)"""
        self.engine.validate(prompt_token_ids, params)  # reads limits only: safe during a step
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._streams[request_id] = queue
        ids = list(prompt_token_ids)
        self._submit(lambda: self.engine.add_request(ids, params, request_id))
        try:
            while True:
                out = await queue.get()
                yield out
                if out.finished:
                    return
        finally:
            self._streams.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        self._submit(lambda: self.engine.abort(request_id))

    def _submit(self, call: Callable[[], object]) -> None:
        self._pending.append(call)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            pending, self._pending = self._pending, []
            for call in pending:
                call()
            if not self.engine.has_unfinished():
                await self._wake.wait()
                self._wake.clear()
                continue
            for out in await asyncio.to_thread(self.engine.step):
                queue = self._streams.get(out.request_id)
                if queue is not None:
                    queue.put_nowait(out)
