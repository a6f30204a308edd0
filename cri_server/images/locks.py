"""File locks (flock) shared by the daemon and the operator CLI on the same root, usable from asyncio.

Async acquisition polls with LOCK_NB so the event loop never blocks in flock(2).
"""
from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator, Iterator

_POLL_S = 0.02
_POLL_MAX_S = 0.25


def _open(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _try(fd: int, op: int) -> bool:
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextlib.asynccontextmanager
async def alock(path: str, shared: bool = False) -> AsyncIterator[None]:
    """Hold flock on `path` (created if missing) for the duration of the block."""
    fd = _open(path)
    try:
        op = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        delay = _POLL_S
        while not _try(fd, op):
            await asyncio.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def lock(path: str, shared: bool = False, timeout: float | None = None) -> Iterator[bool]:
    """Blocking flock; with `timeout` (0 = try once) yields False instead of waiting longer."""
    fd = _open(path)
    try:
        op = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        if timeout is None:
            fcntl.flock(fd, op)
            yield True
            return
        deadline = time.monotonic() + timeout
        while not _try(fd, op):
            if time.monotonic() >= deadline:
                yield False
                return
            time.sleep(_POLL_S)
        yield True
    finally:
        os.close(fd)


def try_lock_fd(path: str, shared: bool = False) -> int | None:
    """Take the lock without waiting; return the fd to keep it (close to release) or None."""
    fd = _open(path)
    if _try(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX):
        return fd
    os.close(fd)
    return None
