"""A server-side SPDY/3.1 session on a ByteStream: stream table, replies, data, FIN/RST, PING, GOAWAY.

Owns the connection-level rules of SPDY. What the streams mean (exec channels, port-forward pairs)
is decided by the on_stream callback of the caller; this module must not know about Kubernetes.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..transport import ByteStream, IdleWatchdog, InboundBuffer
from . import frames as f

log = logging.getLogger("husk.cri.streaming.spdy")

# Outbound data is cut into frames of this size so that one big write cannot hold the connection for
# long and the peer's buffers stay small. spdystream accepts any size up to the 24-bit limit.
DATA_CHUNK = 32 * 1024
# Largest frame accepted from a peer. Data frames may legally reach 16 MiB; control frames carrying
# header blocks are small in every protocol served here.
MAX_INBOUND_DATA = f.MAX_LENGTH
MAX_INBOUND_CONTROL = 1 << 20
# WINDOW_UPDATE is sent once this many bytes were consumed. spdystream ignores these frames and never
# sends them, so the server never waits for a send window; a peer that does honour SPDY/3.1 flow
# control still gets its window reopened and cannot stall.
WINDOW_UPDATE_THRESHOLD = 32 * 1024


class StreamClosedError(ConnectionError):
    """Writing to a stream that was reset, already half-closed, or whose session ended."""


class SpdyStream:
    """One client-initiated stream. read() gets what the client sent; write()/close() send to it."""

    def __init__(self, session: SpdySession, stream_id: int, headers: f.Headers, *, remote_fin: bool,
                 high_water: int) -> None:
        self._session = session
        self.id = stream_id
        self.headers = headers
        self._inbound = InboundBuffer(high_water, self._consumed)
        self._unacked = 0
        self.replied = False
        self.local_closed = False
        self.remote_closed = False
        self.reset_state = False
        if remote_fin:
            self._remote_finished()

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[0] if values else None

    @property
    def finished(self) -> bool:
        return self.reset_state or (self.local_closed and self.remote_closed)

    def reply(self, headers: f.Headers | None = None, fin: bool = False) -> None:
        """Accept the stream (SYN_REPLY). The k8s clients wait for this before opening the next one."""
        if self.replied or self.reset_state:
            return
        self.replied = True
        self._session._send(self._session._encoder.syn_reply(self.id, headers or {}, fin))
        if fin:
            self.local_closed = True
            self._session._maybe_forget(self)

    async def read(self, n: int = 65536) -> bytes:
        """Up to n bytes; b"" once the client sent FIN, reset the stream, or the session ended."""
        return await self._inbound.read(n)

    def discard_input(self) -> None:
        """Nobody reads this stream; drop its data instead of holding up the connection."""
        self._inbound.discard()

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        for start in range(0, len(view), DATA_CHUNK) if view else ():
            self._check_writable()
            self._session._send(f.encode_data(self.id, bytes(view[start:start + DATA_CHUNK])))
            await self._session._drain()

    async def close(self) -> None:
        """Half-close: FIN with an empty data frame. Idempotent; a no-op on a reset stream."""
        if self.local_closed or self.reset_state or self._session.closed:
            self.local_closed = True
            return
        self.local_closed = True
        self._session._send(f.encode_data(self.id, b"", fin=True))
        self._session._maybe_forget(self)
        await self._session._drain()

    def reset(self, status: f.RstStatus = f.RstStatus.CANCEL) -> None:
        if self.reset_state:
            return
        self.reset_state = True
        self._inbound.feed_eof()
        if not self._session.closed:
            self._session._send(f.encode_rst_stream(self.id, status))
        self._session._forget(self)

    # -- called by the session ------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self.reset_state:
            raise StreamClosedError(f"spdy stream {self.id} was reset")
        if self.local_closed:
            raise StreamClosedError(f"spdy stream {self.id} is closed for writing")
        if self._session.closed:
            raise StreamClosedError("spdy session ended")

    def _remote_finished(self) -> None:
        self.remote_closed = True
        self._inbound.feed_eof()

    def _remote_reset(self) -> None:
        self.reset_state = True
        self._inbound.feed_eof()

    def _consumed(self, n: int) -> None:
        self._unacked += n
        if self._unacked >= WINDOW_UPDATE_THRESHOLD and not self.finished and not self._session.closed:
            self._session._send(f.encode_window_update(self.id, self._unacked))
            self._session._send(f.encode_window_update(0, self._unacked))  # SPDY/3.1 session window
            self._unacked = 0


StreamHandler = Callable[[SpdyStream], None]


class SpdySession:
    """Runs the server side of one SPDY/3.1 connection until the peer goes away.

    on_stream is called synchronously for every accepted SYN_STREAM; it must reply() or reset() the
    stream (it may also leave it to a task it starts). PINGs from the peer are echoed; a GOAWAY from
    the peer stops new streams and ends the session once the open ones are done."""

    def __init__(self, stream: ByteStream, on_stream: StreamHandler, *, name: str = "",
                 inbound_high_water: int = 1 << 20, idle_timeout: float | None = None) -> None:
        self._io = stream
        self._on_stream = on_stream
        self.name = name
        self._encoder = f.FrameEncoder()
        self._decoder = f.FrameDecoder()
        self._streams: dict[int, SpdyStream] = {}
        self._last_stream_id = 0
        self._high_water = inbound_high_water
        self.closed = False
        self.goaway_received = False
        self.goaway_sent = False
        self.ended = asyncio.Event()  # set when the read loop stopped (peer EOF, error, or close())
        self._watchdog = IdleWatchdog(idle_timeout, self.close)

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def last_stream_id(self) -> int:
        return self._last_stream_id

    # -- outbound --------------------------------------------------------------------------------------

    def _send(self, frame: bytes) -> None:
        # Encoding and queueing happen with no await in between, so header blocks reach the wire in
        # the order their compression context produced them.
        if self.closed:
            raise StreamClosedError("spdy session ended")
        self._watchdog.touch()
        try:
            self._io.write(frame)
        except (ConnectionError, OSError) as exc:
            self.close()
            raise StreamClosedError(f"spdy connection lost: {exc}") from exc

    async def _drain(self) -> None:
        try:
            await self._io.drain()
        except (ConnectionError, OSError) as exc:
            self.close()
            raise StreamClosedError(f"spdy connection lost: {exc}") from exc

    async def goaway(self, status: f.GoAwayStatus = f.GoAwayStatus.OK) -> None:
        """Tell the peer no more streams are accepted (last good id = the last stream seen)."""
        if self.goaway_sent or self.closed:
            return
        self.goaway_sent = True
        self._send(f.encode_goaway(self._last_stream_id, status))
        await self._drain()

    async def shutdown(self, grace: float) -> None:
        """End the session politely: GOAWAY, half-close, give the peer `grace` seconds to hang up.

        Closing a socket with unread input makes the kernel send RST, which can destroy data the
        peer has not read yet; waiting for the peer's EOF avoids that."""
        if not self.closed and not self.ended.is_set():
            try:
                await self.goaway()
                if self._io.can_write_eof():
                    self._io.write_eof()
            except (StreamClosedError, ConnectionError, OSError):
                pass
            for stream in list(self._streams.values()):
                stream.discard_input()
            try:
                await asyncio.wait_for(self.ended.wait(), grace)
            except asyncio.TimeoutError:
                log.debug("%s: peer did not close within %.1fs", self.name, grace)
        self.close()

    def close(self) -> None:
        """Drop the connection now. Every stream sees EOF; writes fail."""
        if not self.closed:
            self.closed = True
            self._io.close()
        self._finish_all()

    # -- inbound ---------------------------------------------------------------------------------------

    async def run(self) -> None:
        """The read loop. Returns when the peer closed the connection or broke the protocol."""
        self._watchdog.start()
        try:
            while not self.closed:
                try:
                    head_b = await self._io.readexactly(8)
                except (asyncio.IncompleteReadError, ConnectionError, OSError):
                    break
                head = f.parse_frame_header(head_b)
                limit = MAX_INBOUND_CONTROL if head.control else MAX_INBOUND_DATA
                if head.length > limit:
                    await self._protocol_error(f"frame of {head.length} bytes is too large")
                    break
                try:
                    payload = await self._io.readexactly(head.length) if head.length else b""
                except (asyncio.IncompleteReadError, ConnectionError, OSError):
                    break
                self._watchdog.touch()
                try:
                    frame = self._decoder.decode(head, payload)
                except f.SpdyProtocolError as exc:
                    # Header-block and framing errors desynchronise the session: it cannot go on.
                    await self._protocol_error(str(exc))
                    break
                try:
                    await self._dispatch(frame)
                except StreamClosedError:
                    break
                if self.goaway_received and not self._streams:
                    break
        except asyncio.CancelledError:
            self.close()
            raise
        finally:
            await self._watchdog.stop()
            self._finish_all()
            self.ended.set()

    async def _protocol_error(self, reason: str) -> None:
        log.warning("%s: SPDY protocol error: %s", self.name, reason)
        try:
            self._send(f.encode_goaway(self._last_stream_id, f.GoAwayStatus.PROTOCOL_ERROR))
            self.goaway_sent = True
            await self._drain()
        except StreamClosedError:
            pass
        self.close()

    async def _dispatch(self, frame: f.Frame) -> None:
        if isinstance(frame, f.DataFrame):
            await self._on_data(frame)
        elif isinstance(frame, f.SynStreamFrame):
            self._on_syn_stream(frame)
        elif isinstance(frame, f.RstStreamFrame):
            stream = self._streams.pop(frame.stream_id, None)
            if stream is not None:
                log.debug("%s: stream %d reset by peer (status %d)", self.name, stream.id, frame.status)
                stream._remote_reset()
        elif isinstance(frame, f.PingFrame):
            # Client-initiated pings (odd ids; client-go sends one every few seconds on port-forward
            # connections) are echoed unchanged. The server sends none, so an even id is stray.
            if frame.ping_id % 2 == 1:
                self._send(f.encode_ping(frame.ping_id))
        elif isinstance(frame, f.GoAwayFrame):
            log.debug("%s: GOAWAY from peer (last good %d, status %d)", self.name,
                      frame.last_good_stream_id, frame.status)
            self.goaway_received = True
        elif isinstance(frame, f.HeadersFrame):
            stream = self._streams.get(frame.stream_id)
            if stream is not None:
                for k, v in frame.headers.items():
                    stream.headers.setdefault(k, []).extend(v)
                if frame.fin:
                    stream._remote_finished()
                    self._maybe_forget(stream)
        elif isinstance(frame, f.SynReplyFrame):
            # The server opens no streams, so a reply refers to nothing.
            self._send(f.encode_rst_stream(frame.stream_id, f.RstStatus.PROTOCOL_ERROR))
        # SETTINGS, WINDOW_UPDATE and unknown control frames need no action: the server does not
        # limit its sending by the peer's window (spdystream never opens it), and unknown types
        # must be ignored by the SPDY rules.

    def _on_syn_stream(self, frame: f.SynStreamFrame) -> None:
        sid = frame.stream_id
        if sid % 2 == 0 or sid <= self._last_stream_id:
            # Client stream ids are odd and strictly increasing.
            log.warning("%s: invalid new stream id %d (last %d)", self.name, sid, self._last_stream_id)
            self._send(f.encode_rst_stream(sid, f.RstStatus.PROTOCOL_ERROR))
            return
        self._last_stream_id = sid
        if self.goaway_sent or self.goaway_received:
            self._send(f.encode_rst_stream(sid, f.RstStatus.REFUSED_STREAM))
            return
        stream = SpdyStream(self, sid, frame.headers, remote_fin=frame.fin, high_water=self._high_water)
        if frame.unidirectional:
            stream.local_closed = True
        self._streams[sid] = stream
        try:
            self._on_stream(stream)
        except Exception:  # the handler is caller code: a bug there must not kill the session
            log.exception("%s: stream handler failed for stream %d", self.name, sid)
            stream.reset(f.RstStatus.INTERNAL_ERROR)

    async def _on_data(self, frame: f.DataFrame) -> None:
        stream = self._streams.get(frame.stream_id)
        if stream is None:
            if frame.stream_id > self._last_stream_id:
                self._send(f.encode_rst_stream(frame.stream_id, f.RstStatus.INVALID_STREAM))
            # Data for a stream that just ended may still be in flight: drop it quietly.
            return
        if stream.remote_closed:
            stream.reset(f.RstStatus.STREAM_ALREADY_CLOSED)
            return
        if frame.data:
            stream._inbound.feed(frame.data)
        if frame.fin:
            stream._remote_finished()
            self._maybe_forget(stream)
        elif frame.data:
            # Back-pressure: stop reading the connection while this stream's reader is behind.
            await stream._inbound.wait_room()

    def _maybe_forget(self, stream: SpdyStream) -> None:
        if stream.finished:
            self._forget(stream)

    def _forget(self, stream: SpdyStream) -> None:
        self._streams.pop(stream.id, None)
        if self.goaway_received and not self._streams and not self.closed:
            # The peer said GOAWAY and the last stream is done: nothing can happen any more. close()
            # lets the transport flush what is queued before it closes.
            log.debug("%s: last stream done after GOAWAY: closing", self.name)
            self.close()

    def _finish_all(self) -> None:
        for stream in list(self._streams.values()):
            stream._remote_reset()
        self._streams.clear()
