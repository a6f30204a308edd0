"""The container event stream kubelet's evented PLEG reads (GetContainerEvents): a fan-out to subscribers.

Lifecycle code publishes CREATED/STARTED/STOPPED/DELETED as they happen; every subscriber has a bounded
queue, and one that falls too far behind is dropped (kubelet then reconnects or relists). No I/O here.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

log = logging.getLogger(__name__)

MAX_QUEUED = 1000


class EventBus:
    def __init__(self) -> None:
        self._subscribers: set[asyncio.Queue[Any]] = set()

    def publish(self, event: Any) -> None:
        for q in list(self._subscribers):
            try:
                q.put_nowait(event)
            except asyncio.QueueFull:
                log.warning("container event subscriber too slow; dropping it")
                self._subscribers.discard(q)
                while not q.empty():
                    q.get_nowait()
                q.put_nowait(None)

    async def subscribe(self) -> AsyncIterator[Any]:
        """Events from now on, until the subscriber is dropped (then the iteration ends)."""
        q: asyncio.Queue[Any] = asyncio.Queue(MAX_QUEUED)
        self._subscribers.add(q)
        try:
            while True:
                ev = await q.get()
                if ev is None:
                    return
                yield ev
        finally:
            self._subscribers.discard(q)

    def close(self) -> None:
        for q in list(self._subscribers):
            self._subscribers.discard(q)
            try:
                q.put_nowait(None)
            except asyncio.QueueFull:
                pass

    def __len__(self) -> int:
        return len(self._subscribers)
