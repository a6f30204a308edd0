"""RFC 6455 WebSocket, server side: the opening handshake and message framing on asyncio streams.

Owns the WebSocket wire rules (masking, fragmentation, ping/pong, the close handshake). Must not know
the Kubernetes channel protocols built on top (remotecommand.py, portforward.py).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import struct
from collections.abc import Callable

from .httpio import HttpError, HttpRequest

log = logging.getLogger("husk.cri.streaming.ws")

_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

OP_CONT = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_INVALID_DATA = 1007
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL_ERROR = 1011

DEFAULT_MAX_MESSAGE = 16 << 20


class WebSocketError(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"websocket: {reason} (close code {code})")
        self.code = code
        self.reason = reason


def is_websocket_request(req: HttpRequest) -> bool:
    """What wsstream.IsWebSocketRequest checks: Connection mentions upgrade, Upgrade is websocket."""
    upgrade = (req.header("upgrade") or "").strip().lower()
    return upgrade == "websocket" and "upgrade" in [t.lower() for t in req.header_tokens("connection")]


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + _GUID).encode("ascii")).digest()).decode("ascii")


def offered_subprotocols(req: HttpRequest) -> list[str]:
    return req.header_tokens("sec-websocket-protocol")


def negotiate_subprotocol(offered: list[str], supported: tuple[str, ...]) -> str | None:
    """The first protocol the client offered that the server supports; "" when the client offered
    none and the server accepts the unnamed protocol; None when there is no match."""
    if not offered:
        return "" if "" in supported else None
    for proto in offered:
        if proto in supported and proto != "":
            return proto
    return None


def handshake_response(req: HttpRequest, subprotocol: str) -> bytes:
    """Validate the client's opening handshake and build the 101 response, or raise HttpError."""
    if req.method != "GET":
        raise HttpError(400, "websocket: the opening handshake must be a GET request")
    version = (req.header("sec-websocket-version") or "").strip()
    if version != "13":
        raise HttpError(426, f"websocket: unsupported Sec-WebSocket-Version {version!r}",
                        headers=(("Sec-WebSocket-Version", "13"),))
    key = (req.header("sec-websocket-key") or "").strip()
    try:
        if len(base64.b64decode(key, validate=True)) != 16:
            raise ValueError("not 16 bytes")
    except (binascii.Error, ValueError) as exc:
        raise HttpError(400, f"websocket: bad Sec-WebSocket-Key: {exc}") from exc
    lines = [
        "HTTP/1.1 101 Switching Protocols",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Accept: {accept_key(key)}",
    ]
    if subprotocol:
        lines.append(f"Sec-WebSocket-Protocol: {subprotocol}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


def _unmask(payload: bytes, mask: bytes) -> bytes:
    n = len(payload)
    if n == 0:
        return payload
    # XOR as one big integer: far faster in CPython than a per-byte loop, and exact.
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


def encode_frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    """A server frame: never masked."""
    n = len(payload)
    first = (0x80 if fin else 0) | opcode
    if n < 126:
        head = struct.pack("!BB", first, n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", first, 126, n)
    else:
        head = struct.pack("!BBQ", first, 127, n)
    return head + payload


class WebSocketConnection:
    """An open WebSocket (after the 101). One task calls recv(); any task may send()."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 max_message: int = DEFAULT_MAX_MESSAGE, name: str = "") -> None:
        self._reader = reader
        self._writer = writer
        self._max_message = max_message
        self.name = name
        self.close_sent = False
        self.close_received = False
        self.closed = False
        self.close_code: int | None = None
        self.on_activity: Callable[[], None] = lambda: None
        self._reading = False
        self._peer_done = asyncio.Event()  # the client's Close arrived or the connection is gone

    # -- sending ---------------------------------------------------------------------------------------

    def send_nowait(self, opcode: int, payload: bytes) -> None:
        if self.closed or self.close_sent:
            raise ConnectionError("websocket is closing")
        self.on_activity()
        self._writer.write(encode_frame(opcode, payload))

    async def send(self, opcode: int, payload: bytes) -> None:
        self.send_nowait(opcode, payload)
        await self.drain()

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            self.abort()
            raise ConnectionError(f"websocket connection lost: {exc}") from exc

    async def close(self, code: int = CLOSE_NORMAL, reason: str = "", grace: float = 5.0) -> None:
        """The closing handshake: send Close, wait up to `grace` for the client's Close, drop TCP.

        If another task is inside recv(), that task sees the client's Close; otherwise frames are
        read and dropped here until it comes."""
        if not self.closed and not self.close_sent:
            self.close_sent = True
            payload = struct.pack("!H", code) + reason.encode("utf-8")[:120]
            try:
                self._writer.write(encode_frame(OP_CLOSE, payload))
                await self._writer.drain()
            except (ConnectionError, OSError):
                self.abort()
        if not self.closed and not self.close_received:
            try:
                if self._reading:
                    await asyncio.wait_for(self._peer_done.wait(), grace)
                else:
                    await asyncio.wait_for(self._wait_close_frame(), grace)
            except asyncio.TimeoutError:
                log.debug("%s: client did not answer the close within %.1fs", self.name, grace)
        self.abort()

    async def _wait_close_frame(self) -> None:
        while not self.close_received and not self.closed:
            if await self.recv() is None:
                return

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self._writer.close()
        self._peer_done.set()

    # -- receiving -------------------------------------------------------------------------------------

    async def recv(self) -> tuple[int, bytes] | None:
        """The next data message as (OP_TEXT or OP_BINARY, payload); None once the connection ended.

        Pings are answered here; a Close is answered and ends the stream of messages."""
        self._reading = True
        try:
            return await self._recv()
        finally:
            self._reading = False

    async def _recv(self) -> tuple[int, bytes] | None:
        opcode_of_message: int | None = None
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                frame = await self._read_frame()
            except WebSocketError as exc:
                log.warning("%s: %s", self.name, exc)
                await self._fail(exc.code, exc.reason)
                return None
            except (asyncio.IncompleteReadError, ConnectionError, OSError):
                self.abort()
                return None
            fin, opcode, payload = frame
            self.on_activity()
            if opcode >= 0x8:
                if opcode == OP_PING:
                    if not self.close_sent and not self.closed:
                        try:
                            self.send_nowait(OP_PONG, payload)
                        except ConnectionError:
                            return None
                elif opcode == OP_CLOSE:
                    self._on_close_frame(payload)
                    return None
                continue  # unsolicited PONG: nothing to do
            if opcode == OP_CONT:
                if opcode_of_message is None:
                    await self._fail(CLOSE_PROTOCOL_ERROR, "continuation frame without a message")
                    return None
            else:
                if opcode_of_message is not None:
                    await self._fail(CLOSE_PROTOCOL_ERROR, "new message before the last one finished")
                    return None
                opcode_of_message = opcode
            size += len(payload)
            if size > self._max_message:
                await self._fail(CLOSE_TOO_BIG, f"message larger than {self._max_message} bytes")
                return None
            parts.append(payload)
            if fin:
                data = b"".join(parts)
                if opcode_of_message == OP_TEXT:
                    try:
                        data.decode("utf-8")
                    except UnicodeDecodeError:
                        await self._fail(CLOSE_INVALID_DATA, "text message is not UTF-8")
                        return None
                return opcode_of_message, data

    def _on_close_frame(self, payload: bytes) -> None:
        self.close_received = True
        self._peer_done.set()
        code = CLOSE_NORMAL
        if len(payload) >= 2:
            code = struct.unpack("!H", payload[:2])[0]
        self.close_code = code
        if not self.close_sent and not self.closed:
            # Echo the status code, as RFC 6455 section 5.5.1 asks.
            self.close_sent = True
            try:
                self._writer.write(encode_frame(OP_CLOSE, struct.pack("!H", code) if len(payload) >= 2 else b""))
            except (ConnectionError, OSError):
                pass
        # The server closes TCP first (RFC 6455 section 7.1.1); the owner does so via close()/abort().

    async def _fail(self, code: int, reason: str) -> None:
        if not self.close_sent and not self.closed:
            self.close_sent = True
            try:
                self._writer.write(encode_frame(OP_CLOSE, struct.pack("!H", code) + reason.encode()[:120]))
                await asyncio.wait_for(self._writer.drain(), 1.0)
            except (ConnectionError, OSError, asyncio.TimeoutError):
                pass
        self.abort()

    async def _read_frame(self) -> tuple[bool, int, bytes]:
        b0, b1 = await self._reader.readexactly(2)
        fin, rsv, opcode = bool(b0 & 0x80), b0 & 0x70, b0 & 0x0F
        masked, length = bool(b1 & 0x80), b1 & 0x7F
        if rsv:
            raise WebSocketError(CLOSE_PROTOCOL_ERROR, "reserved bits set without a negotiated extension")
        if opcode not in (OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG):
            raise WebSocketError(CLOSE_PROTOCOL_ERROR, f"unknown opcode {opcode:#x}")
        if not masked:
            raise WebSocketError(CLOSE_PROTOCOL_ERROR, "client frames must be masked")
        if opcode >= 0x8 and (not fin or length > 125):
            raise WebSocketError(CLOSE_PROTOCOL_ERROR, "control frames must be whole and at most 125 bytes")
        if length == 126:
            (length,) = struct.unpack("!H", await self._reader.readexactly(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", await self._reader.readexactly(8))
            if length >> 63:
                raise WebSocketError(CLOSE_PROTOCOL_ERROR, "64-bit length with the top bit set")
        if length > self._max_message:
            raise WebSocketError(CLOSE_TOO_BIG, f"frame larger than {self._max_message} bytes")
        mask = await self._reader.readexactly(4)
        payload = await self._reader.readexactly(length) if length else b""
        return fin, opcode, _unmask(payload, mask)


class WebSocketByteStream:
    """A ByteStream over WebSocket binary messages: what the SPDY-over-WebSocket tunnel
    (subprotocol "SPDY/3.1+portforward.k8s.io", client-go's tunneling dialer) runs on."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self._ws = ws
        self._buf = bytearray()
        self._eof = False

    async def readexactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            if self._eof:
                raise asyncio.IncompleteReadError(bytes(self._buf), n)
            msg = await self._ws.recv()
            if msg is None:
                self._eof = True
                continue
            self._buf += msg[1]
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def write(self, data: bytes) -> None:
        self._ws.send_nowait(OP_BINARY, data)

    async def drain(self) -> None:
        await self._ws.drain()

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise OSError("a WebSocket cannot half-close")

    def close(self) -> None:
        if not self._ws.closed and not self._ws.close_sent:
            try:
                self._ws.send_nowait(OP_CLOSE, struct.pack("!H", CLOSE_NORMAL))
            except ConnectionError:
                pass
            self._ws.close_sent = True
        self._ws.abort()

    def is_closing(self) -> bool:
        return self._ws.closed or self._ws.close_sent
