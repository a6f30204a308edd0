"""WebSocket test clients for the channel protocols, on the `websockets` library (independent of the
server's RFC 6455 code)."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import json
import ssl as ssl_mod
import struct
from dataclasses import dataclass

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

STDIN, STDOUT, STDERR, ERROR, RESIZE = 0, 1, 2, 3, 4


@dataclass
class WsExecResult:
    protocol: str | None
    stdout: bytes
    stderr: bytes
    error: bytes
    first_message: tuple[int, bytes] | None
    close_code: int | None


def ws_url(url: str) -> str:
    return "ws" + url[4:] if url.startswith("http") else url


async def ws_open(url: str, protocols: list[str] | None, ssl: ssl_mod.SSLContext | None = None) -> ClientConnection:
    return await connect(ws_url(url), subprotocols=protocols or None, max_size=None, compression=None, ssl=ssl,
                         open_timeout=30)


def encode(proto: str | None, channel: int, data: bytes) -> bytes | str:
    if proto and "base64" in proto:
        return chr(ord("0") + channel) + base64.b64encode(data).decode()
    return bytes((channel,)) + data


def decode(proto: str | None, msg: bytes | str) -> tuple[int, bytes]:
    if isinstance(msg, str):
        assert proto and "base64" in proto, "text message on a binary protocol"
        return ord(msg[0]) - ord("0"), base64.b64decode(msg[1:])
    assert not (proto and "base64" in proto), "binary message on a base64 protocol"
    return msg[0], msg[1:]


async def ws_exec(url: str, *, protocols: list[str] | None = None, stdin: bytes | None = None,
                  close_stdin: bool = True, resizes: tuple[tuple[int, int], ...] = (),
                  ssl: ssl_mod.SSLContext | None = None, on_open=None) -> WsExecResult:
    protocols = ["v5.channel.k8s.io"] if protocols is None else protocols
    ws = await ws_open(url, protocols, ssl)
    proto = ws.subprotocol
    out = {STDOUT: bytearray(), STDERR: bytearray(), ERROR: bytearray()}
    first = None

    async def reader() -> None:
        nonlocal first
        try:
            async for msg in ws:
                ch, data = decode(proto, msg)
                if first is None:
                    first = (ch, data)
                out.setdefault(ch, bytearray()).extend(data)
        except ConnectionClosed:
            pass

    task = asyncio.create_task(reader())
    try:
        if on_open is not None:
            await on_open(ws, proto)
        for w, h in resizes:
            await ws.send(encode(proto, RESIZE, json.dumps({"Width": w, "Height": h}).encode()))
        if stdin is not None:
            for i in range(0, len(stdin), 32768):
                await ws.send(encode(proto, STDIN, stdin[i:i + 32768]))
            if close_stdin and proto == "v5.channel.k8s.io":
                await ws.send(bytes((255, STDIN)))
        await task
    finally:
        await ws.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    code = ws.close_code if ws.close_code is not None else (ws.protocol.close_rcvd.code if ws.protocol.close_rcvd else None)
    return WsExecResult(proto, bytes(out[STDOUT]), bytes(out[STDERR]), bytes(out[ERROR]), first, code)


async def ws_port_forward(url: str, protocol: str, payload: bytes, nports: int = 1,
                          ssl: ssl_mod.SSLContext | None = None) -> tuple[dict[int, bytes], list[int]]:
    """Sends payload on the first port's data channel, collects every channel until the server closes.
    Returns (channel -> bytes without the port prefix, ports announced on the data channels)."""
    ws = await ws_open(url, [protocol] if protocol else None, ssl)
    proto = ws.subprotocol
    got: dict[int, bytearray] = {}
    seen_prefix: set[int] = set()
    ports: list[int] = []
    try:
        await ws.send(encode(proto, 0, payload))
        async for msg in ws:
            ch, data = decode(proto, msg)
            if ch not in seen_prefix:
                seen_prefix.add(ch)
                assert len(data) >= 2, "first message on a port-forward channel carries the port"
                if ch % 2 == 0:
                    ports.append(struct.unpack("<H", data[:2])[0])
                data = data[2:]
            got.setdefault(ch, bytearray()).extend(data)
    except ConnectionClosed:
        pass
    finally:
        await ws.close()
    return {k: bytes(v) for k, v in got.items()}, ports


class RawWsTunnel:
    """A bare RFC 6455 client carrying SPDY, as client-go's tunneling dialer does (each write one binary
    message). Hand-made because `websockets` refuses the subprotocol name "SPDY/3.1+portforward.k8s.io"
    ("/" is not an HTTP token character); gorilla/websocket in client-go sends it regardless."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.buf = bytearray()
        self.closed = False

    @classmethod
    async def connect(cls, url: str, protocol: str) -> tuple["RawWsTunnel", str | None]:
        from .spdy_client import http_request
        key = base64.b64encode(os.urandom(16)).decode()
        reply, reader, writer = await http_request(url, "GET", [
            ("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Key", key), ("Sec-WebSocket-Protocol", protocol)])
        assert reply.status == 101, reply
        expect = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        assert reply.first("sec-websocket-accept") == expect.decode()
        return cls(reader, writer), reply.first("sec-websocket-protocol")

    async def _frame(self) -> tuple[int, bytes]:
        b0, b1 = await self.reader.readexactly(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", await self.reader.readexactly(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", await self.reader.readexactly(8))[0]
        return b0 & 0x0F, await self.reader.readexactly(n)

    async def readexactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            op, payload = await self._frame()
            if op == 0x8:
                raise asyncio.IncompleteReadError(bytes(self.buf), n)
            if op == 0x9:
                self._send(0xA, payload)
            elif op in (0x0, 0x2):
                self.buf += payload
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack("!Q", n)
        key = (mask * (n // 4 + 1))[:n]
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big") if n else b""
        self.writer.write(head + mask + masked)

    def write(self, data: bytes) -> None:
        self._send(0x2, data)

    async def drain(self) -> None:
        await self.writer.drain()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._send(0x8, struct.pack("!H", 1000))
            self.writer.close()

    async def wait_closed(self) -> None:
        await self.writer.wait_closed()
