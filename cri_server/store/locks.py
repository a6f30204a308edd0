"""Per-object asyncio locks: RPCs on one pod or container run one at a time, others in parallel.

A lock exists only while someone holds or waits for it, so the table does not grow with every id ever seen.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator


class KeyedLocks:
    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)

    def is_held(self, key: str) -> bool:
        entry = self._locks.get(key)
        return entry is not None and entry[0].locked()
