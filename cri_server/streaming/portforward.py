"""Port-forward sessions: SPDY stream pairs (portforward.k8s.io, also tunnelled in a WebSocket) and
WebSocket channel pairs (v4.channel.k8s.io), copying to a backend TCP connection both ways.

Owns pairing, the per-connection copy loops and the error messages. Must not parse HTTP or frames.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .backend import StreamBackend
from .remotecommand import OUTPUT_CHUNK, SessionConfig, _stopping
from .requests import PortForwardRequest
from .spdy import frames as spdy_frames
from .spdy.session import SpdySession, SpdyStream, StreamClosedError
from .transport import ByteStream, InboundBuffer, cancel_and_wait
from .websocket import OP_BINARY, OP_TEXT, WebSocketConnection

log = logging.getLogger("husk.cri.streaming")

SPDY_PROTOCOL = "portforward.k8s.io"
SPDY_TUNNEL_PROTOCOL = "SPDY/3.1+portforward.k8s.io"  # client-go's SPDY-over-WebSocket dialer
# kubelet's WebSocket port-forward: channel pairs, binary or base64. "v4.portforward.k8s.io" is not a
# Kubernetes name; it is accepted as an alias of the binary protocol for clients that send it.
WS_PROTOCOLS: dict[str, bool] = {  # name -> base64
    "": False,
    "v4.channel.k8s.io": False,
    "v4.base64.channel.k8s.io": True,
    "v4.portforward.k8s.io": False,
}

# After the target closed its side, how long the client gets to finish sending before the pair is
# torn down (containerd waits 1 s, like socat). The other way round there is no limit: a client that
# half-closed may still be waiting for a slow answer.
CLIENT_DRAIN_GRACE = 1.0


def forward_error(port: int, sandbox_id: str, exc: BaseException) -> str:
    # kubelet's wording; the CRI server passes an empty pod UID.
    return f"error forwarding port {port} to pod {sandbox_id}, uid : {exc}"


@dataclass
class _Endpoint:
    """The client's end of one forwarded connection, whatever the transport."""

    read: Callable[[], Awaitable[bytes]]  # b"" at client EOF
    write: Callable[[bytes], Awaitable[None]]  # raises ConnectionError when the client is gone
    close_write: Callable[[], Awaitable[None]]
    report: Callable[[str], Awaitable[None]]  # an error message for the client
    client_reset: Callable[[], bool]  # the client abandoned this connection


async def _forward(backend: StreamBackend, sandbox_id: str, port: int, ep: _Endpoint) -> None:
    extra = {"pod_sandbox_id": sandbox_id}
    try:
        reader, writer = await backend.port_forward(sandbox_id, port)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning("port-forward to %s:%d failed: %s", sandbox_id, port, exc, extra=extra)
        await ep.report(forward_error(port, sandbox_id, exc))
        return
    log.debug("port-forward to %s:%d connected", sandbox_id, port, extra=extra)

    async def client_to_target() -> None:
        while data := await ep.read():
            writer.write(data)
            await writer.drain()
        if ep.client_reset():
            raise ConnectionAbortedError("client reset the stream")
        if writer.can_write_eof():
            writer.write_eof()

    async def target_to_client() -> None:
        while data := await reader.read(OUTPUT_CHUNK):
            await ep.write(data)
        await ep.close_write()

    up = asyncio.create_task(client_to_target())
    down = asyncio.create_task(target_to_client())
    error: BaseException | None = None
    try:
        done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        first = done.pop()
        error = None if first.cancelled() else first.exception()
        other = down if first is up else up
        if error is None and first is up:
            await asyncio.wait({other})  # the client half-closed; let the answer come back
        elif error is None:
            await asyncio.wait({other}, timeout=CLIENT_DRAIN_GRACE)
        if other.done() and not other.cancelled() and error is None:
            error = other.exception()
    finally:
        await cancel_and_wait(up, down)
        writer.close()
    if error is not None and not isinstance(error, (ConnectionAbortedError, StreamClosedError)) \
            and not ep.client_reset():
        log.info("port-forward to %s:%d ended with %s", sandbox_id, port, error, extra=extra)
        await ep.report(forward_error(port, sandbox_id, error))


# -- SPDY ----------------------------------------------------------------------------------------------


class _Pair:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.data: SpdyStream | None = None
        self.error: SpdyStream | None = None
        self.complete = asyncio.Event()


class _SpdyPortForward:
    """kubelet's httpStreamHandler: pairs the error and data streams of each forwarded connection
    by their requestID header and forwards each complete pair."""

    def __init__(self, request: PortForwardRequest, backend: StreamBackend, cfg: SessionConfig, name: str) -> None:
        self.request = request
        self.backend = backend
        self.cfg = cfg
        self.name = name
        self.pairs: dict[str, _Pair] = {}
        self.tasks: set[asyncio.Task] = set()

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def on_stream(self, stream: SpdyStream) -> None:
        port_s = stream.header("port") or ""
        stream_type = stream.header("streamtype") or ""
        try:
            port = int(port_s, 10)
            if not 0 < port < 65536:
                raise ValueError("out of range")
        except ValueError:
            log.warning("%s: stream %d: bad port header %r", self.name, stream.id, port_s)
            stream.reset(spdy_frames.RstStatus.CANCEL)
            return
        if stream_type not in ("error", "data"):
            log.warning("%s: stream %d: bad stream type %r", self.name, stream.id, stream_type)
            stream.reset(spdy_frames.RstStatus.CANCEL)
            return
        stream.reply()
        request_id = stream.header("requestid")
        if not request_id:
            # Old clients send no requestID: their error and data streams have consecutive odd ids.
            request_id = str(stream.id if stream_type == "error" else stream.id - 2)
        pair = self.pairs.get(request_id)
        if pair is None:
            pair = self.pairs[request_id] = _Pair(request_id)
            self._spawn(self._monitor(pair), f"{self.name}-pair-{request_id}-monitor")
        if stream_type == "error":
            stream.discard_input()  # the client writes nothing here; it closes its side at once
            if pair.error is not None:
                self._spawn(self._complain(pair, "error stream already assigned"), f"{self.name}-dup")
                stream.reset(spdy_frames.RstStatus.PROTOCOL_ERROR)
                return
            pair.error = stream
        else:
            if pair.data is not None:
                self._spawn(self._complain(pair, "data stream already assigned"), f"{self.name}-dup")
                stream.reset(spdy_frames.RstStatus.PROTOCOL_ERROR)
                return
            pair.data = stream
        if pair.error is not None and pair.data is not None:
            pair.complete.set()
            self._spawn(self._run_pair(pair, port), f"{self.name}-pair-{request_id}")

    async def _complain(self, pair: _Pair, what: str) -> None:
        if pair.error is not None:
            try:
                await pair.error.write(f"error processing stream for request {pair.request_id}: {what}".encode())
            except StreamClosedError:
                pass

    async def _monitor(self, pair: _Pair) -> None:
        try:
            await asyncio.wait_for(pair.complete.wait(), self.cfg.stream_creation_timeout)
        except asyncio.TimeoutError:
            log.warning("%s: request %s: timed out waiting for streams", self.name, pair.request_id)
            if pair.error is not None:
                try:
                    await pair.error.write(f"(request={pair.request_id}) timed out waiting for streams".encode())
                    await pair.error.close()
                except StreamClosedError:
                    pass
        finally:
            self.pairs.pop(pair.request_id, None)

    async def _run_pair(self, pair: _Pair, port: int) -> None:
        data, error = pair.data, pair.error
        assert data is not None and error is not None

        async def write(b: bytes) -> None:
            await data.write(b)

        async def close_write() -> None:
            await data.close()

        async def report(msg: str) -> None:
            try:
                await error.write(msg.encode("utf-8"))
            except StreamClosedError:
                pass

        ep = _Endpoint(read=data.read, write=write, close_write=close_write, report=report,
                       client_reset=lambda: data.reset_state)
        try:
            await _forward(self.backend, self.request.pod_sandbox_id, port, ep)
        finally:
            for s in (data, error):
                try:
                    await s.close()
                except StreamClosedError:
                    pass


async def serve_spdy(conn: ByteStream, request: PortForwardRequest, backend: StreamBackend,
                     cfg: SessionConfig, name: str) -> None:
    """Forward connections over one upgraded SPDY connection until the client closes it."""
    handler = _SpdyPortForward(request, backend, cfg, name)
    session = SpdySession(conn, handler.on_stream, name=name, idle_timeout=cfg.idle_timeout)
    try:
        await session.run()
    finally:
        await cancel_and_wait(*handler.tasks)
        await session.shutdown(0 if session.ended.is_set() or _stopping() else cfg.shutdown_grace)


# -- WebSocket channels ----------------------------------------------------------------------------------


async def serve_websocket(ws: WebSocketConnection, b64: bool, request: PortForwardRequest,
                          backend: StreamBackend, cfg: SessionConfig, name: str) -> None:
    """kubelet's WebSocket port-forward: channel 2i carries data and 2i+1 errors for the i-th port of
    the cached request; the server first sends each port (u16 little-endian) on both channels."""
    ports = request.ports
    inbound = [InboundBuffer() for _ in ports]

    async def send(channel: int, payload: bytes) -> None:
        if ws.closed or ws.close_sent:
            raise ConnectionResetError("websocket closed")
        if b64:
            await ws.send(OP_TEXT, chr(ord("0") + channel).encode() + base64.b64encode(payload))
        else:
            await ws.send(OP_BINARY, bytes((channel,)) + payload)

    def endpoint(i: int) -> _Endpoint:
        async def report(msg: str) -> None:
            try:
                await send(2 * i + 1, msg.encode("utf-8"))
            except ConnectionError:
                pass

        async def close_write() -> None:
            return None  # no half-close in this protocol; the connection closes when all pairs end

        return _Endpoint(read=inbound[i].read, write=lambda b: send(2 * i, b), close_write=close_write,
                         report=report, client_reset=lambda: ws.closed or ws.close_received)

    demux = asyncio.create_task(_ws_demux(ws, b64, inbound), name=f"{name}-ws-demux")
    pair_tasks: list[asyncio.Task] = []
    try:
        for i, port in enumerate(ports):
            pb = struct.pack("<H", port)
            await send(2 * i, pb)
            await send(2 * i + 1, pb)
        pair_tasks = [asyncio.create_task(_forward(backend, request.pod_sandbox_id, p, endpoint(i)),
                                          name=f"{name}-port-{p}") for i, p in enumerate(ports)]
        if pair_tasks:
            # Either every forwarded connection ended, or the client went away first.
            all_pairs = asyncio.gather(*pair_tasks, return_exceptions=True)
            waiters: set[asyncio.Future[Any]] = {demux, all_pairs}
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        await ws.close(grace=cfg.shutdown_grace)
    except ConnectionError:
        pass
    finally:
        ws.abort()
        await cancel_and_wait(*pair_tasks)
        await cancel_and_wait(demux)


async def _ws_demux(ws: WebSocketConnection, b64: bool, inbound: list[InboundBuffer]) -> None:
    try:
        while (msg := await ws.recv()) is not None:
            data = msg[1]
            if not data:
                continue
            channel = data[0] - ord("0") if b64 else data[0]
            payload = data[1:]
            if b64:
                try:
                    payload = base64.b64decode(payload, validate=True)
                except binascii.Error:
                    continue
            if channel % 2 == 0 and 0 <= channel // 2 < len(inbound):
                inbound[channel // 2].feed(payload)
                await inbound[channel // 2].wait_room()
    finally:
        for buf in inbound:
            buf.feed_eof()
