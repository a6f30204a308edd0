"""Waiting on a condition, never on a sleep: the one helper the suites share."""
from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(pred: Callable[[], Any], timeout: float = 60.0, what: str | Callable[[], str] = "condition",
             interval: float = 0.05) -> Any:
    """Polls `pred` every `interval` s until it returns a true value, which is returned. After `timeout` s an
    AssertionError names `what` (a string, or a function called then, e.g. to list what is still left) and the
    last value `pred` returned. An exception from `pred` ends the wait at once (a process that died). The
    timeout bounds the wait; it is never what a test asserts."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            text = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g} s waiting for {text} (last value: {v!r})")
        time.sleep(interval)


async def wait_for_async(pred: Callable[[], Any], timeout: float = 60.0, what: str | Callable[[], str] = "condition",
                         interval: float = 0.05) -> Any:
    """wait_for inside an event loop: `pred` may return an awaitable (a coroutine function, or a blocking check
    handed to loop.run_in_executor), which is awaited; the loop keeps running between polls."""
    import asyncio
    import inspect
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        v = pred()
        if inspect.isawaitable(v):
            v = await v
        if v:
            return v
        if loop.time() > deadline:
            text = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g} s waiting for {text} (last value: {v!r})")
        await asyncio.sleep(interval)
