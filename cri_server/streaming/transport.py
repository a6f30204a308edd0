"""Byte transports under the streaming protocols and the bounded buffers between them and the backend.

Owns: the ByteStream interface (a TCP connection, or WebSocket binary messages seen as bytes), the
inbound buffer with back-pressure, and the idle watchdog. Must not know any protocol's framing.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("husk.cri.streaming")


class ByteStream(Protocol):
    """A full-duplex byte pipe: what the SPDY session runs on."""

    async def readexactly(self, n: int) -> bytes:
        """n bytes, or asyncio.IncompleteReadError at end of stream."""

    def write(self, data: bytes) -> None:
        """Queue data in order; one call's bytes are never interleaved with another call's."""

    async def drain(self) -> None:
        """Wait until the queued data is below the transport's high-water mark."""

    def can_write_eof(self) -> bool: ...

    def write_eof(self) -> None: ...

    def close(self) -> None: ...

    def is_closing(self) -> bool: ...


class TcpByteStream:
    """A ByteStream over asyncio's stream pair (plain TCP or TLS)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def readexactly(self, n: int) -> bytes:
        return await self._reader.readexactly(n)

    def write(self, data: bytes) -> None:
        self._writer.write(data)

    async def drain(self) -> None:
        await self._writer.drain()

    def can_write_eof(self) -> bool:
        return self._writer.can_write_eof()

    def write_eof(self) -> None:
        self._writer.write_eof()

    def close(self) -> None:
        self._writer.close()

    def is_closing(self) -> bool:
        return self._writer.is_closing()


class InboundBuffer:
    """Bytes received from the client for one logical stream, waiting for the backend to read them.

    The producer (a frame or message reader) calls feed() and then awaits wait_room(), which blocks
    while more than `high_water` bytes are unread: that stops reading the connection, so a fast client
    meets TCP back-pressure instead of filling memory. A buffer whose consumer went away discards."""

    def __init__(self, high_water: int = 1 << 20, on_consumed: Callable[[int], None] | None = None) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        self._eof = False
        self._discard = False
        self._high_water = high_water
        self._on_consumed = on_consumed
        self._readable = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    @property
    def eof(self) -> bool:
        return self._eof

    @property
    def buffered(self) -> int:
        return self._size

    def feed(self, data: bytes) -> None:
        if self._eof or not data:
            return
        if self._discard:
            if self._on_consumed:
                self._on_consumed(len(data))
            return
        self._chunks.append(data)
        self._size += len(data)
        self._readable.set()
        if self._size >= self._high_water:
            self._room.clear()

    def feed_eof(self) -> None:
        self._eof = True
        self._readable.set()
        self._room.set()

    def discard(self) -> None:
        """Nobody will read this stream: drop what is queued and whatever comes later."""
        self._discard = True
        dropped, self._chunks, self._size = self._size, [], 0
        if dropped and self._on_consumed:
            self._on_consumed(dropped)
        self._room.set()

    async def wait_room(self) -> None:
        await self._room.wait()

    async def read(self, n: int = 65536) -> bytes:
        """Up to n bytes as soon as any are there; b"" once the sender finished and all was read."""
        while not self._chunks:
            if self._eof:
                return b""
            self._readable.clear()
            await self._readable.wait()
        first = self._chunks[0]
        if len(first) <= n:
            self._chunks.pop(0)
            out = first
        else:
            out, self._chunks[0] = first[:n], first[n:]
        self._size -= len(out)
        if self._size < self._high_water:
            self._room.set()
        if self._on_consumed:
            self._on_consumed(len(out))
        return out


class IdleWatchdog:
    """Calls on_idle once nothing was touched for `timeout` seconds (kubelet's stream idle timeout)."""

    def __init__(self, timeout: float | None, on_idle: Callable[[], None]) -> None:
        self._timeout = timeout
        self._on_idle = on_idle
        self._last = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def touch(self) -> None:
        self._last = time.monotonic()

    def start(self) -> None:
        if self._timeout and self._timeout > 0:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        assert self._timeout
        while True:
            remaining = self._last + self._timeout - time.monotonic()
            if remaining <= 0:
                log.info("streaming connection idle for %.0fs: closing", self._timeout)
                self._on_idle()
                return
            await asyncio.sleep(remaining)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None


async def cancel_and_wait(*tasks: asyncio.Task | None) -> None:
    """Cancel tasks and wait until they finished, without swallowing the caller's own cancellation."""
    live = [t for t in tasks if t is not None]
    for t in live:
        t.cancel()
    if live:
        await asyncio.wait(live)
    for t in live:
        if not t.cancelled() and t.exception() is not None:
            log.debug("task %s ended with %r", t.get_name(), t.exception())
