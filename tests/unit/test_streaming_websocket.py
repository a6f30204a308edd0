"""RFC 6455 server side: handshake, framing, control frames, protocol errors (raw client frames)."""
from __future__ import annotations

import asyncio
import os
import struct

import pytest

from cri_server.streaming.httpio import HttpError, HttpRequest
from cri_server.streaming import websocket as ws


def _req(method: str = "GET", **headers: str) -> HttpRequest:
    base = {"upgrade": "websocket", "connection": "Upgrade", "sec-websocket-version": "13",
            "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ=="}
    base.update({k.replace("_", "-"): v for k, v in headers.items()})
    return HttpRequest(method, "/x", "/x", "", "HTTP/1.1", tuple(base.items()))


def test_accept_key_rfc_example():
    assert ws.accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_handshake_response():
    reply = ws.handshake_response(_req(), "v4.channel.k8s.io").decode()
    assert reply.startswith("HTTP/1.1 101 Switching Protocols\r\n")
    assert "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in reply
    assert "Sec-WebSocket-Protocol: v4.channel.k8s.io\r\n" in reply
    assert "Sec-WebSocket-Protocol" not in ws.handshake_response(_req(), "").decode()


def test_handshake_errors():
    with pytest.raises(HttpError) as e:
        ws.handshake_response(_req(sec_websocket_version="8"), "")
    assert e.value.status == 426 and ("Sec-WebSocket-Version", "13") in e.value.headers
    with pytest.raises(HttpError) as e:
        ws.handshake_response(_req(sec_websocket_key="short"), "")
    assert e.value.status == 400
    with pytest.raises(HttpError) as e:
        ws.handshake_response(_req("POST"), "")
    assert e.value.status == 400


def test_subprotocol_negotiation():
    sup = ("", "channel.k8s.io", "v4.channel.k8s.io", "v5.channel.k8s.io")
    assert ws.negotiate_subprotocol(["v5.channel.k8s.io", "v4.channel.k8s.io"], sup) == "v5.channel.k8s.io"
    assert ws.negotiate_subprotocol(["bogus", "v4.channel.k8s.io"], sup) == "v4.channel.k8s.io"
    assert ws.negotiate_subprotocol([], sup) == ""
    assert ws.negotiate_subprotocol(["bogus"], sup) is None
    assert ws.is_websocket_request(_req(connection="keep-alive, Upgrade"))
    assert not ws.is_websocket_request(_req(upgrade="SPDY/3.1"))


@pytest.mark.parametrize("n,head", [(125, b"\x82\x7d"), (126, b"\x82\x7e\x00\x7e"), (65535, b"\x82\x7e\xff\xff"),
                                    (65536, b"\x82\x7f" + struct.pack("!Q", 65536))])
def test_server_frame_lengths(n, head):
    frame = ws.encode_frame(ws.OP_BINARY, b"\0" * n)
    assert frame.startswith(head) and len(frame) == len(head) + n


def _client_frame(opcode: int, payload: bytes, fin: bool = True, mask: bool = True, rsv: int = 0) -> bytes:
    b0 = (0x80 if fin else 0) | rsv | opcode
    n = len(payload)
    if n < 126:
        head = bytes([b0, (0x80 if mask else 0) | n])
    elif n < 65536:
        head = bytes([b0, (0x80 if mask else 0) | 126]) + struct.pack("!H", n)
    else:
        head = bytes([b0, (0x80 if mask else 0) | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


async def _pair(max_message: int = ws.DEFAULT_MAX_MESSAGE):
    """A WebSocketConnection on the server end of a loopback TCP pair, and the raw client end."""
    got: asyncio.Future = asyncio.get_running_loop().create_future()

    async def on_conn(r, w):
        got.set_result(ws.WebSocketConnection(r, w, max_message=max_message, name="test"))
        await asyncio.sleep(3600)

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cr, cw = await asyncio.open_connection("127.0.0.1", port)
    conn = await got
    return server, conn, cr, cw


async def _read_server_frame(r: asyncio.StreamReader) -> tuple[int, bytes]:
    b0, b1 = await r.readexactly(2)
    assert not b1 & 0x80, "server frames are not masked"
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack("!H", await r.readexactly(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", await r.readexactly(8))[0]
    return b0 & 0x0F, await r.readexactly(n)


def _run(test):
    async def main():
        server, conn, cr, cw = await _pair()
        try:
            await test(conn, cr, cw)
        finally:
            conn.abort()
            cw.close()
            server.close()
            await server.wait_closed()
    asyncio.run(asyncio.wait_for(main(), 30))


def test_fragmented_message_with_interleaved_ping():
    async def t(conn, cr, cw):
        cw.write(_client_frame(ws.OP_TEXT, b"hel", fin=False))
        cw.write(_client_frame(ws.OP_PING, b"p1"))
        cw.write(_client_frame(ws.OP_CONT, b"lo ", fin=False))
        cw.write(_client_frame(ws.OP_CONT, "wörld".encode()))
        cw.write(_client_frame(ws.OP_BINARY, b"\x00" * 70000))
        assert await conn.recv() == (ws.OP_TEXT, "hello wörld".encode())
        assert await _read_server_frame(cr) == (ws.OP_PONG, b"p1")
        assert await conn.recv() == (ws.OP_BINARY, b"\x00" * 70000)
    _run(t)


def test_client_close_is_echoed_and_ends_recv():
    async def t(conn, cr, cw):
        cw.write(_client_frame(ws.OP_CLOSE, struct.pack("!H", 1001) + b"bye"))
        assert await conn.recv() is None
        assert conn.close_code == 1001
        assert await _read_server_frame(cr) == (ws.OP_CLOSE, struct.pack("!H", 1001))
    _run(t)


@pytest.mark.parametrize("frame,code", [
    (_client_frame(ws.OP_BINARY, b"x", mask=False), ws.CLOSE_PROTOCOL_ERROR),
    (_client_frame(ws.OP_PING, b"x" * 126), ws.CLOSE_PROTOCOL_ERROR),
    (_client_frame(ws.OP_BINARY, b"x", rsv=0x40), ws.CLOSE_PROTOCOL_ERROR),
    (_client_frame(0x3, b"x"), ws.CLOSE_PROTOCOL_ERROR),
    (_client_frame(ws.OP_CONT, b"x"), ws.CLOSE_PROTOCOL_ERROR),
    (_client_frame(ws.OP_TEXT, b"\xff\xfe"), ws.CLOSE_INVALID_DATA),
])
def test_protocol_errors_close_with_code(frame, code):
    async def t(conn, cr, cw):
        cw.write(frame)
        assert await conn.recv() is None
        op, payload = await _read_server_frame(cr)
        assert op == ws.OP_CLOSE and struct.unpack("!H", payload[:2])[0] == code
        assert await cr.read() == b""  # and the server dropped the connection
    _run(t)


def test_oversized_message_is_refused():
    async def main():
        server, conn, cr, cw = await _pair(max_message=1000)
        try:
            cw.write(_client_frame(ws.OP_BINARY, b"a" * 600, fin=False))
            cw.write(_client_frame(ws.OP_CONT, b"a" * 600))
            assert await conn.recv() is None
            op, payload = await _read_server_frame(cr)
            assert op == ws.OP_CLOSE and struct.unpack("!H", payload[:2])[0] == ws.CLOSE_TOO_BIG
        finally:
            conn.abort()
            cw.close()
            server.close()
            await server.wait_closed()
    asyncio.run(asyncio.wait_for(main(), 30))
