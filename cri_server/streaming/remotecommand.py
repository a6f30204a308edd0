"""Exec and attach sessions over SPDY streams or WebSocket channels (kubelet's remotecommand server).

Owns the channel protocols (stream types, channel numbers, base64 and v5 CLOSE, the error-stream
Status per version, resize decoding) and the run of one backend call. Must not parse HTTP or frames.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from dataclasses import dataclass

from . import status as st
from .backend import ResizeQueue, StreamBackend, StreamIO, TerminalSize
from .requests import AttachRequest, ExecRequest
from .spdy import frames as spdy_frames
from .spdy.session import SpdySession, SpdyStream, StreamClosedError
from .transport import ByteStream, InboundBuffer, cancel_and_wait
from .websocket import OP_BINARY, OP_TEXT, WebSocketConnection

log = logging.getLogger("husk.cri.streaming")

OUTPUT_CHUNK = 32 * 1024


@dataclass(frozen=True)
class ChannelProtocol:
    """One negotiated remotecommand subprotocol and what it implies."""

    name: str
    json_status: bool  # v4+: a metav1.Status JSON on the error stream; else plain text on failure
    resize: bool  # whether TTY size changes are carried
    base64: bool = False  # WebSocket text variant: '0'..'4' channel characters, base64 payloads
    stream_close: bool = False  # WebSocket v5: [255, channel] half-closes a channel


# SPDY (X-Stream-Protocol-Version). v5 over SPDY behaves as v4: its CLOSE signal is a WebSocket thing,
# a SPDY stream half-closes with FIN. Current clients offer v5 first, so accepting it matters.
SPDY_PROTOCOLS: dict[str, ChannelProtocol] = {
    "v5.channel.k8s.io": ChannelProtocol("v5.channel.k8s.io", json_status=True, resize=True),
    "v4.channel.k8s.io": ChannelProtocol("v4.channel.k8s.io", json_status=True, resize=True),
    "v3.channel.k8s.io": ChannelProtocol("v3.channel.k8s.io", json_status=False, resize=True),
    "v2.channel.k8s.io": ChannelProtocol("v2.channel.k8s.io", json_status=False, resize=False),
    "channel.k8s.io": ChannelProtocol("channel.k8s.io", json_status=False, resize=False),
}
SPDY_FALLBACK = "channel.k8s.io"  # a client that offers no version gets v1

# WebSocket (Sec-WebSocket-Protocol). "" is a client that asked for no subprotocol: binary v1.
WS_PROTOCOLS: dict[str, ChannelProtocol] = {
    "v5.channel.k8s.io": ChannelProtocol("v5.channel.k8s.io", json_status=True, resize=True, stream_close=True),
    "v4.channel.k8s.io": ChannelProtocol("v4.channel.k8s.io", json_status=True, resize=True),
    "v4.base64.channel.k8s.io": ChannelProtocol("v4.base64.channel.k8s.io", json_status=True, resize=True,
                                                base64=True),
    "channel.k8s.io": ChannelProtocol("channel.k8s.io", json_status=False, resize=True),
    "base64.channel.k8s.io": ChannelProtocol("base64.channel.k8s.io", json_status=False, resize=True,
                                             base64=True),
    "": ChannelProtocol("", json_status=False, resize=True),
}

# Stream types (SPDY "streamtype" header) and WebSocket channel numbers.
STDIN, STDOUT, STDERR, ERROR, RESIZE = "stdin", "stdout", "stderr", "error", "resize"
WS_CHANNELS = {STDIN: 0, STDOUT: 1, STDERR: 2, ERROR: 3, RESIZE: 4}
WS_STREAM_CLOSE = 255


@dataclass(frozen=True)
class SessionConfig:
    stream_creation_timeout: float = 30.0
    idle_timeout: float | None = 4 * 3600.0
    shutdown_grace: float = 5.0


# -- the part shared by both transports --------------------------------------------------------------


class ResizeDecoder:
    """Turns the resize stream (JSON objects, one after another, any whitespace between) into sizes.

    Mirrors Go's json.Decoder loop in kubelet: the first malformed value ends resize handling."""

    MAX_PENDING = 64 * 1024

    def __init__(self, queue: ResizeQueue) -> None:
        self._queue = queue
        self._buf = ""
        self._broken = False

    def feed(self, data: bytes) -> None:
        if self._broken:
            return
        try:
            self._buf += data.decode("utf-8")
        except UnicodeDecodeError:
            self._stop("resize stream is not UTF-8")
            return
        while not self._broken:
            text = self._buf.lstrip()
            if not text:
                self._buf = ""
                return
            if text[0] != "{":
                self._stop(f"resize stream: expected a JSON object, got {text[:20]!r}")
                return
            end = _object_end(text)
            if end < 0:
                self._buf = text
                if len(text) > self.MAX_PENDING:
                    self._stop("resize stream: object too large")
                return
            self._buf = text[end:]
            try:
                obj = json.loads(text[:end])
                size = _terminal_size(obj)
            except (ValueError, TypeError) as exc:
                self._stop(f"resize stream: {exc}")
                return
            self._queue.put(size)

    def close(self) -> None:
        self._queue.close()

    def _stop(self, why: str) -> None:
        log.warning("%s; ignoring further resize events", why)
        self._broken = True
        self._buf = ""
        self._queue.close()


def _object_end(text: str) -> int:
    """Index just past the JSON object that starts text[0], or -1 if it is not complete yet."""
    depth, in_str, esc = 0, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def _terminal_size(obj: object) -> TerminalSize:
    if not isinstance(obj, dict):
        raise TypeError("resize event is not an object")
    # Go's encoding/json matches field names case-insensitively; absent fields stay 0.
    fields = {k.lower(): v for k, v in obj.items()}
    vals = []
    for name in ("width", "height"):
        v = fields.get(name, 0)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 0xFFFF:
            raise ValueError(f"{name} {v!r} is not a uint16")
        vals.append(v)
    return TerminalSize(vals[0], vals[1])


async def run_backend(backend: StreamBackend, request: ExecRequest | AttachRequest, io: StreamIO) -> st.Status:
    """Call the backend and turn its outcome into the Status kubelet would write."""
    cid = request.container_id
    extra = {"container_id": cid}
    try:
        if isinstance(request, ExecRequest):
            code = await backend.exec(cid, list(request.cmd), io)
            if code < 0:  # a signal number the way asyncio reports it
                code = 128 - code
            log.info("exec in container %s: %s exited with %d", cid, list(request.cmd), code, extra=extra)
            return st.SUCCESS if code == 0 else st.exit_status(list(request.cmd), code)
        await backend.attach(cid, io)
        log.info("attach to container %s ended", cid, extra=extra)
        return st.SUCCESS
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # any backend failure is reported to the client, not raised
        what = "error executing command in container" if isinstance(request, ExecRequest) \
            else "error attaching to container"
        log.warning("%s %s: %s", what, cid, exc, extra=extra)
        return st.internal_error(f"{what}: {exc}")


def _status_bytes(proto: ChannelProtocol, status: st.Status) -> bytes:
    return status.to_json() if proto.json_status else status.to_text()


def _stopping() -> bool:
    """True while the current task is being cancelled (server stop): skip polite waits."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _set_when(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()


# -- SPDY ---------------------------------------------------------------------------------------------


class _SpdyOutput:
    def __init__(self, stream: SpdyStream) -> None:
        self._stream = stream

    async def write(self, data: bytes) -> None:
        try:
            await self._stream.write(data)
        except StreamClosedError:
            pass  # the client is gone or reset this stream: drop, as the OutputStream contract says

    async def close(self) -> None:
        try:
            await self._stream.close()
        except StreamClosedError:
            pass


class _SpdyStreamCollector:
    """Receives the client's streams (kubelet's waitForStreams): replies to each at once, since the
    Go client waits for every reply before opening the next, and counts the known types."""

    def __init__(self, proto: ChannelProtocol, expected: int) -> None:
        self.known = {ERROR, STDIN, STDOUT, STDERR} | ({RESIZE} if proto.resize else set())
        self.expected = expected
        self.streams: dict[str, SpdyStream] = {}
        self.complete = asyncio.Event()

    def on_stream(self, stream: SpdyStream) -> None:
        if self.complete.is_set():
            stream.reset(spdy_frames.RstStatus.REFUSED_STREAM)
            return
        stream_type = stream.header("streamtype") or ""
        stream.reply()
        if stream_type not in self.known or stream_type in self.streams:
            log.warning("unexpected stream type %r (stream %d)", stream_type, stream.id)
            stream.discard_input()
            return
        self.streams[stream_type] = stream
        if stream_type not in (STDIN, RESIZE):
            stream.discard_input()  # the server never reads what a client sends on these
        if len(self.streams) == self.expected:
            self.complete.set()


def _expected_streams(proto: ChannelProtocol, req: ExecRequest | AttachRequest) -> int:
    return 1 + req.stdin + req.stdout + req.stderr + (1 if req.tty and proto.resize else 0)


async def _wait_first(*events: asyncio.Event, timeout: float) -> None:
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


async def serve_spdy(conn: ByteStream, proto: ChannelProtocol, request: ExecRequest | AttachRequest,
                     backend: StreamBackend, cfg: SessionConfig, name: str) -> None:
    """Run one exec/attach session on an upgraded SPDY connection, then close it."""
    collector = _SpdyStreamCollector(proto, _expected_streams(proto, request))
    session = SpdySession(conn, collector.on_stream, name=name, idle_timeout=cfg.idle_timeout)
    reader = asyncio.create_task(session.run(), name=f"{name}-spdy-reader")
    helpers: list[asyncio.Task] = []
    try:
        await _wait_first(collector.complete, session.ended, timeout=cfg.stream_creation_timeout)
        if not collector.complete.is_set():
            why = "client went away" if session.ended.is_set() else "timed out waiting for client to create streams"
            log.warning("%s: %s (got %s)", name, why, sorted(collector.streams),
                        extra={"container_id": request.container_id})
            return
        streams = collector.streams
        resize = None
        if request.tty and proto.resize and RESIZE in streams:
            resize = ResizeQueue()
            helpers.append(asyncio.create_task(_pump_spdy_resize(streams[RESIZE], ResizeDecoder(resize))))
        if STDIN in streams and not request.stdin:
            streams[STDIN].discard_input()
        io = StreamIO(
            tty=request.tty,
            stdin=streams[STDIN] if request.stdin and STDIN in streams else None,
            stdout=_SpdyOutput(streams[STDOUT]) if request.stdout and STDOUT in streams else None,
            stderr=_SpdyOutput(streams[STDERR]) if request.stderr and STDERR in streams else None,
            resize=resize,
        )
        helpers.append(asyncio.create_task(_set_when(session.ended, io.client_gone)))
        status = await run_backend(backend, request, io)
        for kind in (STDOUT, STDERR):
            if kind in streams:
                await _SpdyOutput(streams[kind]).close()
        if ERROR in streams:
            err = _SpdyOutput(streams[ERROR])
            data = _status_bytes(proto, status)
            if data:
                await err.write(data)
            await err.close()
        for stream in streams.values():
            await _SpdyOutput(stream).close()
    finally:
        await cancel_and_wait(*helpers)
        await session.shutdown(0 if _stopping() else cfg.shutdown_grace)
        await cancel_and_wait(reader)


async def _pump_spdy_resize(stream: SpdyStream, decoder: ResizeDecoder) -> None:
    try:
        while data := await stream.read():
            decoder.feed(data)
    finally:
        decoder.close()


# -- WebSocket -----------------------------------------------------------------------------------------


class _WsOutput:
    def __init__(self, ws: WebSocketConnection, proto: ChannelProtocol, channel: int) -> None:
        self._ws = ws
        self._proto = proto
        self._channel = channel

    async def write(self, data: bytes) -> None:
        for start in range(0, len(data), OUTPUT_CHUNK):
            await self.send(data[start:start + OUTPUT_CHUNK])

    async def send(self, chunk: bytes) -> None:
        if self._ws.closed or self._ws.close_sent:
            return  # client gone: drop, as the OutputStream contract says
        try:
            if self._proto.base64:
                await self._ws.send(OP_TEXT, (chr(ord("0") + self._channel)).encode() + base64.b64encode(chunk))
            else:
                await self._ws.send(OP_BINARY, bytes((self._channel,)) + chunk)
        except ConnectionError:
            pass

    async def close(self) -> None:
        # The channel protocols have no server-side half-close; the end of the connection ends all.
        return None


async def serve_websocket(ws: WebSocketConnection, proto: ChannelProtocol, request: ExecRequest | AttachRequest,
                          backend: StreamBackend, cfg: SessionConfig, name: str) -> None:
    """Run one exec/attach session on an open WebSocket, then close it."""
    stdin = InboundBuffer() if request.stdin else None
    resize = ResizeQueue() if request.tty else None
    decoder = ResizeDecoder(resize) if resize is not None else None
    io = StreamIO(
        tty=request.tty,
        stdin=stdin,
        stdout=_WsOutput(ws, proto, WS_CHANNELS[STDOUT]) if request.stdout else None,
        stderr=_WsOutput(ws, proto, WS_CHANNELS[STDERR]) if request.stderr else None,
        resize=resize,
    )
    # kubelet sends one empty message on the lowest writable channel to say the session is ready.
    first = STDOUT if request.stdout else STDERR if request.stderr else ERROR
    demux = asyncio.create_task(_ws_demux(ws, proto, stdin, decoder, io), name=f"{name}-ws-demux")
    try:
        await _WsOutput(ws, proto, WS_CHANNELS[first]).send(b"")
        status = await run_backend(backend, request, io)
        data = _status_bytes(proto, status)
        if data:
            await _WsOutput(ws, proto, WS_CHANNELS[ERROR]).write(data)
        await ws.close(grace=cfg.shutdown_grace)
    finally:
        ws.abort()
        await cancel_and_wait(demux)


async def _ws_demux(ws: WebSocketConnection, proto: ChannelProtocol, stdin: InboundBuffer | None,
                    decoder: ResizeDecoder | None, io: StreamIO) -> None:
    try:
        while (msg := await ws.recv()) is not None:
            data = msg[1]
            if not data:
                continue
            if proto.stream_close and data[0] == WS_STREAM_CLOSE:
                if len(data) != 2:
                    log.warning("%s: CLOSE signal must carry exactly one channel byte", ws.name)
                    break
                if data[1] == WS_CHANNELS[STDIN] and stdin is not None:
                    stdin.feed_eof()
                elif data[1] == WS_CHANNELS[RESIZE] and decoder is not None:
                    decoder.close()
                continue
            channel = data[0] - ord("0") if proto.base64 else data[0]
            payload = data[1:]
            if proto.base64:
                try:
                    payload = base64.b64decode(payload, validate=True)
                except binascii.Error:
                    log.warning("%s: invalid base64 on channel %d; dropped", ws.name, channel)
                    continue
            if channel == WS_CHANNELS[STDIN] and stdin is not None:
                stdin.feed(payload)
                await stdin.wait_room()
            elif channel == WS_CHANNELS[RESIZE] and decoder is not None:
                decoder.feed(payload)
            # Anything else (output channels, unknown numbers) is ignored, as wsstream does.
    finally:
        if stdin is not None:
            stdin.feed_eof()
        if decoder is not None:
            decoder.close()
        io.client_gone.set()
