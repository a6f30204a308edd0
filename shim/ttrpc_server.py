"""ttrpc server on the shim's event loop: accepts unix connections, frames, dispatches unary calls.

Owns the connection state machine and turning handler outcomes into Response frames. It must never
let bad input end the process: every malformed frame or failing handler becomes a status or a close.
"""
from __future__ import annotations

import os
import socket
import struct

from shim import ttrpc_wire as w
from shim.loop import Loop
from shim.pb import rpc_status, ttrpc
from shim.protobuf import DecodeError, Message, lookup
from shim.log import get as get_logger

log = get_logger(__name__)

# Bound on bytes queued for one client that does not read its responses; past it the connection is closed.
MAX_WRITE_BUFFER = 16 << 20
# Bound on concurrently outstanding requests of one connection (each may be a blocked Wait).
MAX_INFLIGHT = 1024

_PEERCRED = struct.Struct("3i")


class Pending:
    """Returned by a handler whose answer comes later: call ctx.reply()/ctx.fail() when it is known."""


PENDING = Pending()


class CallContext:
    """One call in flight: answer it with reply() or fail(), now or later."""
    __slots__ = ("conn", "stream_id", "service", "method", "resp_type", "metadata", "done")

    def __init__(self, conn: "_Conn", stream_id: int, service: str, method: str, resp_type: type[Message],
                 metadata: dict[str, str]) -> None:
        self.conn = conn
        self.stream_id = stream_id
        self.service = service
        self.method = method
        self.resp_type = resp_type
        self.metadata = metadata
        self.done = False

    @property
    def namespace(self) -> str:
        return self.metadata.get(w.NAMESPACE_KEY, "")

    @property
    def alive(self) -> bool:
        return not self.done and not self.conn.closed

    def reply(self, msg: Message) -> None:
        if self.done:
            return
        self.done = True
        self.conn.inflight.pop(self.stream_id, None)
        self.conn.send_response(self.stream_id, msg.encode(), None)

    def fail(self, code: int, message: str) -> None:
        if self.done:
            return
        self.done = True
        self.conn.inflight.pop(self.stream_id, None)
        self.conn.send_response(self.stream_id, b"", rpc_status.Status(code=code, message=message))




class Service:
    """A ttrpc service: method name -> (request type, response type, handler)."""

    def __init__(self, name: str, methods: dict[str, tuple[str, str]], impl: object) -> None:
        self.name = name
        self.methods: dict[str, tuple[type[Message], type[Message], object]] = {}
        for mname, (req, resp) in methods.items():
            handler = getattr(impl, mname, None)
            if handler is None:
                continue
            self.methods[mname] = (lookup(req), lookup(resp), handler)


class Server:
    def __init__(self, loop: Loop, sock: socket.socket, services: list[Service],
                 allowed_uids: tuple[int, ...] | None = None) -> None:
        self.loop = loop
        self.sock = sock
        self.sock.setblocking(False)
        self.services = {s.name: s for s in services}
        # containerd's shims accept only their own uid (and root); None disables the check (tests).
        self.allowed_uids = allowed_uids
        self.conns: set[_Conn] = set()
        self.on_disconnect = None
        loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                log.warning("ttrpc accept: %s", err)
                return
            if self.allowed_uids is not None:
                pid, uid, gid = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                 _PEERCRED.size))
                if uid not in self.allowed_uids:
                    log.warning("ttrpc: refusing connection from pid %d uid %d", pid, uid)
                    conn.close()
                    continue
            conn.setblocking(False)
            self.conns.add(_Conn(self, conn))

    def close(self) -> None:
        try:
            self.loop.remove(self.sock.fileno())
        except (KeyError, ValueError):
            pass
        self.sock.close()
        for c in list(self.conns):
            c.close()

    def dispatch(self, ctx: CallContext, req: Message, handler) -> None:
        try:
            result = handler(ctx, req)
        except w.TtrpcError as err:
            ctx.fail(err.code, err.message)
            return
        except Exception as err:  # a handler bug must answer, not kill the shim
            log.exception("ttrpc %s/%s failed", ctx.service, ctx.method)
            ctx.fail(w.INTERNAL, f"{type(err).__name__}: {err}")
            return
        if result is PENDING:
            return
        if result is None:
            result = ctx.resp_type()
        ctx.reply(result)


class _Conn:
    def __init__(self, server: Server, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.fd = sock.fileno()
        self.reader = w.FrameReader()
        self.wbuf = bytearray()
        self.closed = False
        self.inflight: dict[int, CallContext] = {}
        self.last_stream = 0
        server.loop.add_reader(self.fd, self._on_read)

    def _on_read(self) -> None:
        try:
            data = self.sock.recv(256 << 10)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if not data:
            self.close()
            return
        self.reader.feed(data)
        for sid, mtype, flags, payload in self.reader.frames():
            if self.closed:
                return
            self._on_frame(sid, mtype, flags, payload)

    def _on_frame(self, sid: int, mtype: int, flags: int, payload: bytes | None) -> None:
        if mtype != w.TYPE_REQUEST:
            # The task API has no client streams: Data frames and unknown types are dropped.
            log.debug("ttrpc: ignoring frame type %d on stream %d", mtype, sid)
            return
        if payload is None:
            self.send_response(sid, b"", rpc_status.Status(
                code=w.RESOURCE_EXHAUSTED, message=f"message larger than {w.MAX_MESSAGE} bytes"))
            return
        if sid % 2 != 1:
            self.send_response(sid, b"", rpc_status.Status(
                code=w.INVALID_ARGUMENT, message=f"stream id {sid} must be odd for client-initiated streams"))
            return
        if sid in self.inflight:
            self.send_response(sid, b"", rpc_status.Status(
                code=w.INVALID_ARGUMENT, message=f"stream id {sid} is already in use"))
            return
        if len(self.inflight) >= MAX_INFLIGHT:
            self.send_response(sid, b"", rpc_status.Status(
                code=w.RESOURCE_EXHAUSTED, message=f"more than {MAX_INFLIGHT} requests in flight"))
            return
        try:
            req = ttrpc.Request.decode(payload)
        except DecodeError as err:
            self.send_response(sid, b"", rpc_status.Status(code=w.INVALID_ARGUMENT,
                                                           message=f"malformed request: {err}"))
            return
        svc = self.server.services.get(req.service)
        entry = svc.methods.get(req.method) if svc is not None else None
        if entry is None:
            what = "service" if svc is None else "method"
            self.send_response(sid, b"", rpc_status.Status(
                code=w.UNIMPLEMENTED, message=f"{req.service}/{req.method}: {what} not implemented"))
            return
        req_type, resp_type, handler = entry
        try:
            body = req_type.decode(req.payload)
        except DecodeError as err:
            self.send_response(sid, b"", rpc_status.Status(code=w.INVALID_ARGUMENT,
                                                           message=f"malformed {req_type.FULL_NAME}: {err}"))
            return
        self.last_stream = max(self.last_stream, sid)
        ctx = CallContext(self, sid, req.service, req.method, resp_type,
                          {kv.key: kv.value for kv in req.metadata})
        self.inflight[sid] = ctx
        self.server.dispatch(ctx, body, handler)

    def send_response(self, sid: int, payload: bytes, status: rpc_status.Status | None) -> None:
        if self.closed:
            return
        body = ttrpc.Response(status=status, payload=payload).encode()
        if len(body) > w.MAX_MESSAGE:
            body = ttrpc.Response(status=rpc_status.Status(
                code=w.RESOURCE_EXHAUSTED, message=f"response larger than {w.MAX_MESSAGE} bytes")).encode()
        self.wbuf += w.frame(sid, w.TYPE_RESPONSE, body)
        if len(self.wbuf) > MAX_WRITE_BUFFER:
            log.warning("ttrpc: client does not read its responses; closing")
            self.close()
            return
        self._flush()

    def _flush(self) -> None:
        while self.wbuf:
            try:
                n = self.sock.send(self.wbuf)
            except (BlockingIOError, InterruptedError):
                self.server.loop.add_writer(self.fd, self._flush)
                return
            except OSError:
                self.close()
                return
            del self.wbuf[:n]
        self.server.loop.remove_writer(self.fd)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.server.loop.remove(self.fd)
        self.sock.close()
        self.inflight.clear()
        self.server.conns.discard(self)
        if self.server.on_disconnect is not None:
            self.server.on_disconnect()


def listen_unix(path: str) -> socket.socket:
    """A listening unix socket at `path` (an existing dead socket file is replaced)."""
    from shim.unixpath import bind_unix
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    bind_unix(sock, path)
    sock.listen(128)
    return sock
