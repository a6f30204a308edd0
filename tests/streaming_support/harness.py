"""Running a StreamingServer with a HostBackend inside one test's event loop, with leak checks."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from cri_server.streaming import StreamingOptions, StreamingServer

from .backends import HostBackend

T = TypeVar("T")

# A safety net against hangs only: every test finishes in well under this on a loaded 2-core machine.
TEST_TIMEOUT = 120.0


def run(main: Callable[[], Awaitable[T]], timeout: float = TEST_TIMEOUT) -> T:
    async def guarded() -> T:
        return await asyncio.wait_for(main(), timeout)
    return asyncio.run(guarded())


@contextlib.asynccontextmanager
async def serving(backend: HostBackend | None = None, tls: ssl.SSLContext | None = None,
                  **config: object) -> AsyncIterator[tuple[StreamingServer, HostBackend]]:
    be = backend or HostBackend()
    before = set(asyncio.all_tasks())
    srv = StreamingServer(("127.0.0.1", 0), be, tls=tls, options=StreamingOptions(**config))  # type: ignore[arg-type]
    await srv.start()
    try:
        yield srv, be
    finally:
        await srv.stop()
        await be.close()
        # Give cancelled callbacks one turn of the loop to finish before counting.
        await asyncio.sleep(0)
        leftover = [t for t in asyncio.all_tasks() - before if t is not asyncio.current_task() and not t.done()]
        assert not leftover, f"tasks left running after stop(): {leftover}"
        assert srv.active_connections == 0
        assert not be.leaked_pids(), f"processes left behind: {be.leaked_pids()}"


logging.getLogger("husk.cri.streaming").setLevel(logging.DEBUG)
