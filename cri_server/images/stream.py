"""LayerPipe: a blob's bytes, in order, from the downloading event loop to the thread that unpacks it, so a layer
is unpacked while it downloads. Bytes that do not arrive in order (a restarted or shared download) are read
from the verified blob file at the end instead; the unpacker's diff_id check covers whatever it was given.
"""
from __future__ import annotations

import asyncio
import queue
import threading

CHUNK = 1 << 20
_EOF = b""


class Aborted(Exception):
    """The producer gave up; the unpacking thread stops."""


class LayerPipe:
    def __init__(self, maxsize: int = 16) -> None:
        self._q: queue.Queue[bytes] = queue.Queue(maxsize)
        self.pos = 0  # bytes handed over, in order
        self.live = True  # False once a chunk arrived out of order: the rest comes from the file
        self.consumer_done = threading.Event()
        self._aborted = threading.Event()
        self._buf = b""
        self._off = 0
        self._eof = False

    # -- producer (event loop) -------------------------------------------------------------------------------
    async def feed(self, offset: int, chunk: bytes) -> None:
        """Offer `chunk` found at `offset` of the blob; kept only if it continues what was handed over."""
        if not self.live or not chunk or self.consumer_done.is_set():
            return
        if offset != self.pos:
            self.live = False
            return
        await self._put(chunk)
        self.pos += len(chunk)

    async def finish(self, blob_path: str) -> None:
        """The blob is complete and verified: hand over what is missing from the file, then end of stream."""
        if not self.consumer_done.is_set():
            with open(blob_path, "rb") as f:
                f.seek(self.pos)
                while chunk := f.read(CHUNK):
                    await self._put(chunk)
                    self.pos += len(chunk)
        await self._put(_EOF)

    def abort(self) -> None:
        self._aborted.set()

    async def _put(self, item: bytes) -> None:
        try:
            self._q.put_nowait(item)
        except queue.Full:
            await asyncio.to_thread(self._put_blocking, item)

    def _put_blocking(self, item: bytes) -> None:
        while not (self.consumer_done.is_set() or self._aborted.is_set()):
            try:
                self._q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    # -- consumer (worker thread): a read-only file object ---------------------------------------------------
    def _fill(self) -> bool:
        while self._off >= len(self._buf):
            if self._eof:
                return False
            try:
                item = self._q.get(timeout=0.1)
            except queue.Empty:
                if self._aborted.is_set():
                    raise Aborted("layer download aborted") from None
                continue
            if item is _EOF or not item:
                self._eof = True
                return False
            self._buf, self._off = item, 0
        return True

    def read(self, n: int = -1) -> bytes:
        if self._aborted.is_set():
            raise Aborted("layer download aborted")
        if n is None or n < 0:
            parts = []
            while self._fill():
                parts.append(self._buf[self._off:])
                self._off = len(self._buf)
            return b"".join(parts)
        if n == 0 or not self._fill():
            return b""
        b = self._buf[self._off:self._off + n]
        self._off += len(b)
        return b

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.consumer_done.set()
