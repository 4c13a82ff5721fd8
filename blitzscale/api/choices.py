"""A request's choices started together (`n` > 1, a batch of prompts: one backend request
each): all of them, or none, and a refusal that names the prompt at fault."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from blitzscale.api.generation import Generation
from blitzscale.core.outputs import RequestOutput
from blitzscale.errors import InvalidRequestError, OverloadedError


class ChoiceRefused(Exception):
    """Choice `index` of a request could not start (`error`); none of its choices runs."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(index, error)
        self.index, self.error = index, error


async def start_all(
    starts: list[Awaitable[tuple[Generation, RequestOutput]]],
) -> list[tuple[Generation, RequestOutput]]:
    """Start every choice, in order of index; as soon as one is refused, the others stop
    (those still starting are cancelled, those started closed) and ChoiceRefused says
    which and why: no work goes on for an answer that will not be sent."""
    tasks = [asyncio.ensure_future(s) for s in starts]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:  # (this route was cancelled: so is every start, and what started closes)
        await _stop(tasks)
        raise
    failed = next((i for i, t in enumerate(tasks) if t.done() and not t.cancelled() and t.exception()), None)
    if failed is None:
        return [t.result() for t in tasks]
    await _stop(tasks)
    raise ChoiceRefused(failed, tasks[failed].exception())  # type: ignore[arg-type]


async def _stop(tasks: list[asyncio.Future[tuple[Generation, RequestOutput]]]) -> None:
    """Cancel the starts still waiting (each closes its generation) and close the started."""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    started = [t.result() for t in tasks if not t.cancelled() and t.exception() is None]
    await asyncio.gather(*(g.close() for g, _ in started))


def batch_error(error: BaseException, index: int, size: int) -> BaseException:
    """A refusal of prompt `index` of a batch of `size`, naming it where the error is about
    the prompt (its tokens, their count, the context), and saying so where the batch's own
    earlier prompts are what it would wait behind (overload: retrying the same batch
    would meet the same queue)."""
    if isinstance(error, InvalidRequestError) and error.param == "prompt":
        where = f"prompt[{index}]"
        return InvalidRequestError(f"{where}: {error}", where)
    if isinstance(error, OverloadedError) and index > 0:
        return OverloadedError(
            f"prompt[{index}] of a batch of {size}: {error} (the batch's own earlier prompts are "
            "counted ahead of it: send fewer prompts a request)",
            error.retry_after_s,
        )
    return error
