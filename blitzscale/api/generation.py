"""One request on the backend, from submission to its finished output, and client disconnects.

A `Generation` iterates the backend's output stream in one task of its own (the backend's
iterator is only ever touched by that task, whatever route reads the outputs), times each
output as it arrives, and aborts the request on the backend unless it finished. Routes read
outputs from it and wrap their waits in `until_disconnected`, so a client that leaves while
its request is still queued or generating frees the backend's KV blocks at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from starlette.types import Receive

from blitzscale.api.backend import ServingBackend
from blitzscale.api.errors import ClientDisconnected
from blitzscale.api.metrics import ApiMetrics
from blitzscale.api.timing import Timing
from blitzscale.core.outputs import RequestOutput, TokenLogprob
from blitzscale.core.sampling import SamplingParams
from blitzscale.errors import InvalidRequestError, UnavailableError

log = logging.getLogger(__name__)

T = TypeVar("T")

# Optional backend method: `queue_time_s(request_id) -> float | None`, the seconds the request
# waited before its first step; asked once, after the first output. Without it the API reports
# arrival -> first output as queue time.
QUEUE_TIME_HOOK = "queue_time_s"
SHUTTING_DOWN = "the server is shutting down: the request was stopped before it finished"


class Generation:
    """The outputs of one backend request, pumped by a task that owns the backend iterator."""

    def __init__(
        self,
        backend: ServingBackend,
        metrics: ApiMetrics,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival: float,
        stream: bool = True,
        stopping: asyncio.Event | None = None,
    ) -> None:
        """`stream`: the client reads the outputs as they come (else only the whole answer,
        and the backend may run the request again after an output: `RequestOutput.restarted`).
        `stopping`: set when the server stops serving (`SHUTTING_DOWN`): a request still
        running then ends with a 503, a stream with its error event, rather than being cut."""
        self.request_id = request_id
        self.stream = stream
        self.params = params
        self.timing = Timing(arrival)
        self._backend = backend
        self._metrics = metrics
        self._queue: asyncio.Queue[RequestOutput | Exception] = asyncio.Queue()
        self._logprobs: list[TokenLogprob] = []  # of every output read so far
        self._prompt_logprobs: tuple[TokenLogprob, ...] = ()  # from the output with the first token
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_output_tokens = 0  # generated so far (the access log reads it)
        self._is_reading = True  # the pump still waits on the backend (cancel it to stop)
        self._task = asyncio.create_task(self._pump(prompt_token_ids), name=f"generation {request_id}")
        self._stop_watch = asyncio.create_task(self._stop_on(stopping)) if stopping is not None else None

    async def next(self) -> RequestOutput:
        """The next output; raises what the backend raised (InvalidRequestError -> 400)."""
        item = await self._queue.get()
        if isinstance(item, Exception):
            raise item
        if item.restarted:
            self._logprobs, self._prompt_logprobs = [], ()
        self._logprobs += item.logprobs
        if item.prompt_logprobs and not self._prompt_logprobs:
            self._prompt_logprobs = item.prompt_logprobs
        self.num_output_tokens = len(item.token_ids)
        return item

    async def final(self) -> RequestOutput:
        """Read up to the finished output (its `text` and `token_ids` are the whole output)."""
        while not (out := await self.next()).finished:
            pass
        return self.whole(out)

    def whole(self, final: RequestOutput) -> RequestOutput:
        """The finished output with the logprobs of every token (outputs carry their own)
        and the prompt's (the first output carries them)."""
        return dataclasses.replace(
            final, logprobs=tuple(self._logprobs), prompt_logprobs=self._prompt_logprobs
        )

    async def close(self) -> None:
        """Stop the request if it still runs (the pump aborts it on the backend); idempotent.
        A pump already past reading (aborting after a failure) is waited for, not cancelled."""
        if self._stop_watch is not None:
            self._stop_watch.cancel()
        if self._is_reading:
            self._task.cancel()
        (result,) = await asyncio.gather(self._task, return_exceptions=True)
        if isinstance(result, Exception):
            log.warning("closing request %s failed: %r", self.request_id, result)

    async def _stop_on(self, stopping: asyncio.Event) -> None:
        try:
            await stopping.wait()
        except RuntimeError as e:  # (an app served from a second event loop: its event is the first's)
            log.warning("request %s will not be stopped at shutdown: %s", self.request_id, e)
            return
        if self._is_reading:  # (the pump's cancellation aborts the request on the backend)
            self._queue.put_nowait(UnavailableError(SHUTTING_DOWN))
            self._task.cancel()

    async def _pump(self, prompt_token_ids: list[int]) -> None:
        """Every output, then what ended the request, into the queue: an exception too, even
        one the backend raises when called (a reader waiting on the queue must never hang)."""
        outputs: AsyncIterator[RequestOutput] | None = None
        needs_abort = True
        try:
            outputs = self._backend.generate(
                self.request_id, prompt_token_ids, self.params, stream=self.stream
            )
            async for out in outputs:
                self._note(out)
                self._queue.put_nowait(out)
                if out.finished:
                    needs_abort = False
                    return
            self._queue.put_nowait(RuntimeError("the backend ended a stream without a finished output"))
        except InvalidRequestError as e:
            needs_abort = self.timing.first_output is not None  # rejected up front: nothing to free
            self._queue.put_nowait(e)
        except Exception as e:
            self._queue.put_nowait(e)
        finally:
            self._is_reading = False
            if outputs is not None:
                await _aclose(outputs)
            if needs_abort:
                await self._backend.abort(self.request_id)

    def _note(self, out: RequestOutput) -> None:
        is_first = self.timing.first_output is None
        had_token = self.timing.first_token is not None
        for gap in self.timing.record(out, time.perf_counter()):
            self._metrics.observe_tbt(gap)
        if not had_token and self.timing.ttft_s is not None:
            self._metrics.observe_ttft(self.timing.ttft_s)
        hook = getattr(self._backend, QUEUE_TIME_HOOK, None)
        if is_first and callable(hook):
            self.timing.backend_queue_s = hook(self.request_id)


async def _aclose(outputs: AsyncIterator[Any]) -> None:
    aclose = getattr(outputs, "aclose", None)
    if aclose is not None:
        await aclose()


async def start(
    receive: Receive,
    backend: ServingBackend,
    metrics: ApiMetrics,
    request_id: str,
    prompt_token_ids: list[int],
    params: SamplingParams,
    arrival: float,
    stream: bool = True,
    stopping: asyncio.Event | None = None,
) -> tuple[Generation, RequestOutput]:
    """Submit a request and wait for its first output: until then nothing is sent, so a
    request the backend rejects still gets a 400 rather than a broken 200 stream. `stream`:
    the client will read the outputs as they come (False: the route answers once);
    `stopping`: the server's (`stopping_of`)."""
    gen = Generation(backend, metrics, request_id, prompt_token_ids, params, arrival, stream, stopping)
    try:
        first = await until_disconnected(receive, gen.next())
    except BaseException:
        await gen.close()
        raise
    return gen, first


def stopping_of(request: Any) -> asyncio.Event | None:
    """The app's "the server stops serving" event (`app.state.stopping`; None: none)."""
    return getattr(request.app.state, "stopping", None)


async def finish(receive: Receive, gen: Generation, first: RequestOutput) -> RequestOutput:
    """The finished output of a started request (non-streaming routes); always closes `gen`."""
    try:
        return gen.whole(first) if first.finished else await until_disconnected(receive, gen.final())
    finally:
        await gen.close()


async def until_disconnected(receive: Receive, awaitable: Awaitable[T]) -> T:
    """`await awaitable`, unless the client disconnects first: then raise ClientDisconnected.

    Call only after the request body was read: this consumes the ASGI receive channel.
    """
    work = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        done, _ = await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        work.cancel()
        watch.cancel()
        raise
    watch.cancel()
    if work in done:
        return work.result()
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    raise ClientDisconnected


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
