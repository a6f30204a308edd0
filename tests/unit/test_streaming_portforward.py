"""Port-forward over SPDY (portforward.k8s.io), SPDY tunnelled in a WebSocket, and WebSocket channels,
to TCP servers on 127.0.0.1 run by the test."""
from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import struct

import pytest

from cri_server.streaming import PortForwardRequest
from tests.streaming_support.harness import run, serving
from tests.streaming_support.spdy_client import SpdyClient, spdy_connect
from tests.streaming_support.ws_client import RawWsTunnel, ws_open, ws_port_forward
from tests.support.waiting import wait_for_async


class Target:
    """A TCP server: answers each connection with the upper-cased input once the client half-closes,
    or with the digest of everything received when the input starts with 'md5'."""

    def __init__(self) -> None:
        self.connections = 0
        self.closed = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> "Target":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            data = await r.read()  # until the forwarded client half-closes (or the pair is torn down)
            if data.startswith(b"md5"):
                w.write(hashlib.md5(data).hexdigest().encode())
            elif data.startswith(b"big"):
                w.write(b"z" * (10 * 1024 * 1024))
            else:
                w.write(data.upper())
            await w.drain()
        except ConnectionError:
            pass
        finally:
            w.close()
            self.closed.set()


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


async def _pair(client: SpdyClient, port: int, request_id: str | None):
    headers = {"streamType": "error", "port": str(port)}
    if request_id is not None:
        headers["requestID"] = request_id
    err = await client.open_stream(headers)
    await err.close()  # client-go closes its side of the error stream at once
    data = await client.open_stream({**headers, "streamType": "data"})
    return err, data


async def _round_trip(client: SpdyClient, port: int, payload: bytes, request_id: str | None = "0"):
    err, data = await _pair(client, port, request_id)
    await data.send(payload, fin=True)
    answer = await data.read_all()
    message = await err.read_all()
    await data.reset()  # what client-go does once the remote side is done
    return answer, message


def test_spdy_forward_and_half_close():
    async def main():
        async with Target() as t, serving() as (srv, be):
            reply, client = await spdy_connect(srv.get_port_forward_url(PortForwardRequest("s1")),
                                               ["portforward.k8s.io"])
            assert reply.first("x-stream-protocol-version") == "portforward.k8s.io"
            assert await _round_trip(client, t.port, b"hello") == (b"HELLO", b"")
            await client.close()
    run(main)


def test_spdy_many_connections_on_one_session_and_legacy_pairing():
    async def main():
        async with Target() as t, serving() as (srv, be):
            _, client = await spdy_connect(srv.get_port_forward_url(PortForwardRequest("s1")), ["portforward.k8s.io"])
            results = await asyncio.gather(*(_round_trip(client, t.port, f"m{i}".encode(), str(i)) for i in range(12)))
            assert results == [(f"M{i}".encode(), b"") for i in range(12)]
            # Old clients send no requestID: error and data streams pair by consecutive ids.
            assert await _round_trip(client, t.port, b"old", None) == (b"OLD", b"")
            assert t.connections == 13
            await client.close()
    run(main)


def test_spdy_10mb_both_ways():
    async def main():
        async with Target() as t, serving() as (srv, be):
            _, client = await spdy_connect(srv.get_port_forward_url(PortForwardRequest("s1")), ["portforward.k8s.io"])
            up = b"md5" + os.urandom(10 * 1024 * 1024)
            answer, msg = await _round_trip(client, t.port, up)
            assert answer == hashlib.md5(up).hexdigest().encode() and msg == b""
            answer, msg = await _round_trip(client, t.port, b"big", "1")
            assert answer == b"z" * (10 * 1024 * 1024)
            await client.close()
    run(main)


def test_spdy_connection_refused_goes_to_error_stream():
    async def main():
        async with serving() as (srv, be):
            _, client = await spdy_connect(srv.get_port_forward_url(PortForwardRequest("s1")), ["portforward.k8s.io"])
            port = _free_port()
            err, data = await _pair(client, port, "0")
            message = await err.read_all()
            assert message.startswith(f"error forwarding port {port} to pod s1, uid : ".encode())
            assert b"refused" in message.lower() or b"connect call failed" in message.lower()
            assert await data.read_all() == b""
            await client.close()
    run(main)


@pytest.mark.parametrize("headers", [
    {"streamType": "data"},  # no port
    {"streamType": "data", "port": "0"},
    {"streamType": "data", "port": "70000"},
    {"streamType": "data", "port": "http"},
    {"streamType": "stdin", "port": "80"},
    {"port": "80"},
])
def test_spdy_bad_stream_headers_are_reset(headers):
    async def main():
        async with serving() as (srv, be):
            _, client = await spdy_connect(srv.get_port_forward_url(PortForwardRequest("s1")), ["portforward.k8s.io"])
            with pytest.raises(ConnectionResetError, match="status 5"):
                await client.open_stream(headers)
            # The session survives a refused stream.
            await client.ping(1)
            await client.close()
            assert be.forward_targets == []
    run(main)


def test_spdy_ping_echo_and_goaway():
    async def main():
        async with Target() as t, serving() as (srv, be):
            _, client = await spdy_connect(srv.get_port_forward_url(PortForwardRequest("s1")), ["portforward.k8s.io"])
            for pid in (1, 3, 0x7FFFFFFF):
                await client.ping(pid)
            err, data = await _pair(client, t.port, "0")
            await client.send_goaway(last=0)
            # Streams opened before GOAWAY carry on; new ones are refused.
            with pytest.raises(ConnectionResetError, match="status 3"):
                await client.open_stream({"streamType": "error", "port": str(t.port), "requestID": "9"})
            await data.send(b"late", fin=True)
            assert await data.read_all() == b"LATE"
            assert await err.read_all() == b""
            await client.eof.wait()  # once the open streams are done, the server ends the session
            await client.close()
    run(main)


def test_spdy_client_disconnect_closes_target_connection():
    async def main():
        async with Target() as t, serving() as (srv, be):
            _, client = await spdy_connect(srv.get_port_forward_url(PortForwardRequest("s1")), ["portforward.k8s.io"])
            err, data = await _pair(client, t.port, "0")
            await data.send(b"partial")
            await wait_for_async(lambda: t.connections, 10, "the forwarded connection to reach the target",
                                 interval=0.01)
            await client.close()
            await t.closed.wait()  # the target saw the forwarded connection end
    run(main)


def test_spdy_protocol_errors_invalid_stream_ids():
    async def main():
        async with serving() as (srv, be):
            _, client = await spdy_connect(srv.get_port_forward_url(PortForwardRequest("s1")), ["portforward.k8s.io"])
            client.next_id = 2  # even ids belong to the server
            with pytest.raises(ConnectionResetError, match="status 1"):
                await client.open_stream({"streamType": "error", "port": "80"})
            client.next_id = 7
            await client.open_stream({"streamType": "error", "port": "80", "requestID": "x"})
            client.next_id = 5  # not increasing
            with pytest.raises(ConnectionResetError, match="status 1"):
                await client.open_stream({"streamType": "error", "port": "80"})
            # Data for a stream never opened: INVALID_STREAM.
            client.raw((99).to_bytes(4, "big") + b"\x00\x00\x00\x01x")
            await client.ping(1)
            assert (99, 2) in client.rst_unknown
            await client.close()
    run(main)


def test_spdy_tunnelled_in_websocket():
    async def main():
        async with Target() as t, serving() as (srv, be):
            tunnel, proto = await RawWsTunnel.connect(srv.get_port_forward_url(PortForwardRequest("s1")),
                                                      "SPDY/3.1+portforward.k8s.io")
            assert proto == "SPDY/3.1+portforward.k8s.io"
            client = SpdyClient(tunnel, tunnel)  # type: ignore[arg-type]
            await client.ping(1)
            assert await _round_trip(client, t.port, b"tunnel") == (b"TUNNEL", b"")
            await client.close()
    run(main)


class LineTarget(Target):
    """Answers the first line, upper-cased, then closes: WebSocket channels have no half-close."""

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        w.write((await r.readline()).upper())
        await w.drain()
        w.close()
        self.closed.set()


@pytest.mark.parametrize("proto", ["v4.channel.k8s.io", "v4.base64.channel.k8s.io", "", "v4.portforward.k8s.io"])
def test_websocket_channels(proto):
    async def main():
        async with LineTarget() as t, serving() as (srv, be):
            url = srv.get_port_forward_url(PortForwardRequest("s1", (t.port,)))
            got, ports = await ws_port_forward(url, proto, b"hello ws\n")
            assert ports == [t.port]
            assert got[0] == b"HELLO WS\n" and got.get(1, b"") == b""
    run(main)


def test_websocket_two_ports_one_connection():
    async def main():
        async with LineTarget() as t1, LineTarget() as t2, serving() as (srv, be):
            url = srv.get_port_forward_url(PortForwardRequest("s1", (t1.port, t2.port)))
            ws = await ws_open(url, ["v4.channel.k8s.io"])
            got: dict[int, bytes] = {}
            await ws.send(bytes([0]) + b"one\n")
            await ws.send(bytes([2]) + b"two\n")
            async for msg in ws:
                got[msg[0]] = got.get(msg[0], b"") + msg[1:]
            assert got[0] == struct.pack("<H", t1.port) + b"ONE\n" and got[2] == struct.pack("<H", t2.port) + b"TWO\n"
            assert got[1] == struct.pack("<H", t1.port) and got[3] == struct.pack("<H", t2.port)
    run(main)


def test_websocket_refused_port_reports_on_error_channel():
    async def main():
        async with serving() as (srv, be):
            port = _free_port()
            got, ports = await ws_port_forward(srv.get_port_forward_url(PortForwardRequest("s1", (port,))),
                                               "v4.channel.k8s.io", b"x")
            assert ports == [port]
            assert got[1].startswith(f"error forwarding port {port} to pod s1".encode())
    run(main)
