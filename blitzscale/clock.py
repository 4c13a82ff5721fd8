"""The control plane's clock: the running event loop's time.

On the server's loop that is `time.monotonic()`; in the simulator it is the virtual clock
of its event loop (sim/clock.py), so the same router, scaler and policies run unchanged
against simulated time. Outside any loop (scripts, threads) it is `time.monotonic()`.
"""

from __future__ import annotations

import asyncio
import time


def now() -> float:
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()
