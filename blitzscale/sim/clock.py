"""An asyncio event loop on a virtual clock.

Whenever the loop would sleep until its next timer, the clock jumps there instead, so
`asyncio.sleep`, `wait_for` timeouts and `loop.time()` (hence `blitzscale.clock.now()`)
all run on simulated seconds and a simulation takes only the CPU time of its events. The
router, scaler and policies run on it unchanged.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class SimulationStalled(RuntimeError):
    """Nothing is scheduled and nothing is ready: the simulation can never go on."""


class _VirtualSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimulationStalled("no event is scheduled and nothing is ready")
        if timeout > 0:
            self.now += timeout
        return super().select(0)


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._vsel = _VirtualSelector()
        super().__init__(self._vsel)

    def time(self) -> float:
        return self._vsel.now


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to its end on a fresh virtual-clock loop (starting at t = 0)."""
    loop = VirtualClockLoop()
    loop.set_exception_handler(_interrupts_are_not_errors)
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            _cancel_pending(loop)
        finally:
            loop.close()


def _interrupts_are_not_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler: a task that Ctrl-C stopped (its KeyboardInterrupt
    goes on up to the command, which says so) is not reported again; anything else is."""
    if not isinstance(context.get("exception"), KeyboardInterrupt):
        loop.default_exception_handler(context)


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks still pending (the run was interrupted, Ctrl-C) and let them unwind
    on the loop, as `asyncio.run` does: none is then destroyed pending, and none schedules
    its cleanup on a closed loop (each would print a traceback)."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if not pending:
        return
    for t in pending:
        t.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
