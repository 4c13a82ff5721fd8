"""Tokenizing off the event loop: a long prompt takes the tokenizer a second or more, during
which the loop would answer nothing (streams, /health). One thread, so the tokenizer is
never used from two threads at once (fast tokenizers are not safe for that)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")


async def off_loop(fn: Callable[..., T], *args: object) -> T:
    return await asyncio.get_running_loop().run_in_executor(_pool, fn, *args)
