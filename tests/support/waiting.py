"""Waiting on a condition, never on a sleep: the one helper the suites share."""
from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(pred: Callable[[], Any], timeout: float = 60.0, what: str = "condition",
             interval: float = 0.05) -> Any:
    """Polls `pred` until it returns a true value (returned); AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
