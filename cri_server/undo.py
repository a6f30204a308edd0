"""A rollback list: every step that creates something registers its undo the moment it succeeds.

On failure the undos run newest first; each one's own failure is logged and the rest still run, so a
failed RunPodSandbox or CreateContainer leaves nothing behind. On success the list is discarded.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any, Callable

log = logging.getLogger(__name__)


class Undo:
    def __init__(self, object_id: str) -> None:
        self.object_id = object_id
        self._steps: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = []

    def push(self, what: str, fn: Callable[..., Any], *args: Any) -> None:
        self._steps.append((what, fn, args))

    def discard(self) -> None:
        self._steps.clear()

    async def run(self) -> None:
        """Runs every undo, newest first. Shielded: a cancelled RPC still cleans up completely."""
        steps, self._steps = self._steps, []
        if steps:
            await asyncio.shield(self._run(steps))

    async def _run(self, steps: list[tuple[str, Callable[..., Any], tuple[Any, ...]]]) -> None:
        for what, fn, args in reversed(steps):
            try:
                r = fn(*args)
                if inspect.isawaitable(r):
                    await r
            except Exception as e:  # noqa: BLE001 -- every undo must get its chance; this one is logged
                log.error("undo failed: %s", what, extra={"id": self.object_id, "error": f"{type(e).__name__}: {e}"})
