"""The ttrpc clients of the shim's services (the only ones in the tree): a thread-safe sync client, an asyncio
client, and one blocking call without threads.

`TtrpcClient` multiplexes concurrent calls from many threads over one connection (a reader thread
matches responses to stream ids); husk-cri uses `AsyncTtrpcClient` on its own event loop. `TaskClient`
wraps the sync one with one method per task API call, `AsyncTtrpcClient.task/husk` call by method name,
`call_task_once` is one call on a fresh connection (husk-cri's offline commands). Requests and responses are
built and read by shim/ttrpc_call.py, frames by shim/ttrpc_wire.py. No grpc/protobuf here.
"""
from __future__ import annotations

import socket
import threading
from typing import Any

from shim import ttrpc_wire as w
from shim.pb import husk as huskpb
from shim.pb import task as taskpb
from shim.protobuf import Message, lookup
from shim.ttrpc_call import call_once, make_request, read_result  # noqa: F401 (call_once re-exported)
from shim.unixpath import connect_unix, socket_path

TASK_SERVICE = "containerd.task.v2.Task"
HUSK_SERVICE = "husk.shim.v1.Shim"


def resolve(service: str, method: str) -> tuple[type[Message], type[Message]]:
    """The request and response types of `service`/`method` (the task API or husk's own); KeyError if unknown."""
    table = taskpb.SERVICES[TASK_SERVICE] if service == TASK_SERVICE else huskpb.SERVICES[HUSK_SERVICE]
    req_name, resp_name = table[method]
    return lookup(req_name), lookup(resp_name)


def _metadata(metadata: dict[str, str] | None, namespace: str) -> dict[str, str]:
    md = dict(metadata or {})
    if namespace:
        md.setdefault(w.NAMESPACE_KEY, namespace)
    return md


def _response(payload: bytes | None, resp_type: type[Message]) -> Any:
    """The answer of one response frame (None: the frame reader dropped it as too large)."""
    if payload is None:
        raise w.TtrpcError(w.RESOURCE_EXHAUSTED, "response too large")
    return read_result(payload, resp_type)


def call_task_once(address: str, method: str, timeout: float = 5.0, **fields: Any) -> Any:
    """One containerd.task.v2.Task call on a fresh connection, no threads (husk-cri's offline commands)."""
    req_type, resp_type = resolve(TASK_SERVICE, method)
    return call_once(address, TASK_SERVICE, method, req_type(**fields), resp_type, timeout=timeout)


class _Waiter:
    __slots__ = ("event", "payload", "error")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.payload: bytes | None = None
        self.error: BaseException | None = None


class TtrpcClient:
    """A connection to one ttrpc server. Safe to share between threads; calls may overlap."""

    def __init__(self, address: str, timeout: float = 10.0, namespace: str = "") -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.settimeout(timeout)
        try:
            connect_unix(self.sock, socket_path(address))
        except OSError:
            self.sock.close()
            raise
        self.sock.settimeout(None)
        self.namespace = namespace
        self._lock = threading.Lock()
        self._next = 1
        self._waiters: dict[int, _Waiter] = {}
        self._closed: BaseException | None = None
        self._reader = threading.Thread(target=self._read_loop, name="ttrpc-client", daemon=True)
        self._reader.start()

    def call(self, service: str, method: str, req: Message, resp_type: type[Message] | str,
             timeout: float | None = None, metadata: dict[str, str] | None = None) -> Any:
        if isinstance(resp_type, str):
            resp_type = lookup(resp_type)
        body = make_request(service, method, req, timeout, _metadata(metadata, self.namespace))
        waiter = _Waiter()
        with self._lock:
            if self._closed is not None:
                raise ConnectionError(f"ttrpc connection closed: {self._closed}")
            sid = self._next
            self._next += 2
            self._waiters[sid] = waiter
            try:
                self.sock.sendall(w.frame(sid, w.TYPE_REQUEST, body))
            except OSError:
                self._waiters.pop(sid, None)
                raise
        if not waiter.event.wait(timeout):
            with self._lock:
                self._waiters.pop(sid, None)
            raise w.TtrpcError(w.DEADLINE_EXCEEDED, f"{service}/{method}: no answer in {timeout}s")
        if waiter.error is not None:
            raise ConnectionError(f"{service}/{method}: {waiter.error}")
        return _response(waiter.payload, resp_type)

    def _read_loop(self) -> None:
        reader = w.FrameReader()
        err: BaseException = EOFError("connection closed by the server")
        try:
            while True:
                data = self.sock.recv(256 << 10)
                if not data:
                    break
                reader.feed(data)
                for sid, mtype, _flags, payload in reader.frames():
                    if mtype != w.TYPE_RESPONSE:
                        continue
                    with self._lock:
                        waiter = self._waiters.pop(sid, None)
                    if waiter is None:
                        continue
                    waiter.payload = payload
                    waiter.event.set()
        except OSError as e:
            err = e
        with self._lock:
            self._closed = err
            waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.error = err
            waiter.event.set()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._reader.join(timeout=5)

    def __enter__(self) -> "TtrpcClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TaskClient:
    """containerd.task.v2.Task (+ husk.shim.v1.Shim) over a TtrpcClient. Methods take keyword fields."""

    def __init__(self, address: str, timeout: float = 10.0, namespace: str = "") -> None:
        self.conn = TtrpcClient(address, timeout=timeout, namespace=namespace)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "TaskClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, method: str) -> Any:
        if method in taskpb.SERVICES[TASK_SERVICE]:
            service = TASK_SERVICE
        elif method in huskpb.SERVICES[HUSK_SERVICE]:
            service = HUSK_SERVICE
        else:
            raise AttributeError(method)

        def call(timeout: float | None = 60.0, **fields: Any) -> Any:
            req_type, resp_type = resolve(service, method)
            return self.conn.call(service, method, req_type(**fields), resp_type, timeout=timeout)
        call.__name__ = method
        return call


class AsyncTtrpcClient:
    """The same protocol on asyncio (for husk-cri's grpc.aio loop); asyncio is imported only here."""

    def __init__(self, reader: Any, writer: Any, namespace: str = "") -> None:
        import asyncio
        self._reader = reader
        self._writer = writer
        self.namespace = namespace
        self._next = 1
        self._futures: dict[int, Any] = {}
        self._closed: BaseException | None = None     # set once the read loop ended: no answer can come
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def connect(cls, address: str, namespace: str = "") -> "AsyncTtrpcClient":
        import asyncio
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        try:
            path = socket_path(address)
            await asyncio.get_running_loop().run_in_executor(None, _blocking_connect, sock, path)
        except OSError:
            sock.close()
            raise
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        return cls(reader, writer, namespace)

    async def call(self, service: str, method: str, req: Message, resp_type: type[Message] | str,
                   timeout: float | None = None, metadata: dict[str, str] | None = None) -> Any:
        import asyncio
        if isinstance(resp_type, str):
            resp_type = lookup(resp_type)
        md = _metadata(metadata, self.namespace)
        if self._closed is not None:
            # A call after the connection ended would wait for an answer forever (Wait has no timeout).
            raise ConnectionError(f"{service}/{method}: ttrpc connection closed: {self._closed}")
        sid = self._next
        self._next += 2
        fut = asyncio.get_running_loop().create_future()
        self._futures[sid] = fut
        try:
            self._writer.write(w.frame(sid, w.TYPE_REQUEST, make_request(service, method, req, timeout, md)))
            await self._writer.drain()
        except BaseException:
            self._futures.pop(sid, None)
            raise
        try:
            payload = await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise w.TtrpcError(w.DEADLINE_EXCEEDED, f"{service}/{method}: no answer in {timeout}s") from None
        finally:
            self._futures.pop(sid, None)
        return _response(payload, resp_type)

    @property
    def closed(self) -> bool:
        """True once the connection ended (no answer can come): reconnect instead of calling."""
        return self._closed is not None or self._task.done()

    async def task(self, method: str, timeout: float | None = 60.0, **fields: Any) -> Any:
        """A containerd.task.v2.Task call by method name with the request's fields as keywords."""
        req_type, resp_type = resolve(TASK_SERVICE, method)
        return await self.call(TASK_SERVICE, method, req_type(**fields), resp_type, timeout=timeout)

    async def husk(self, method: str, timeout: float | None = 60.0, **fields: Any) -> Any:
        """A husk.shim.v1.Shim call by method name with the request's fields as keywords."""
        req_type, resp_type = resolve(HUSK_SERVICE, method)
        return await self.call(HUSK_SERVICE, method, req_type(**fields), resp_type, timeout=timeout)

    async def _read_loop(self) -> None:
        reader = w.FrameReader()
        err: BaseException = EOFError("connection closed by the server")
        try:
            while True:
                data = await self._reader.read(256 << 10)
                if not data:
                    break
                reader.feed(data)
                for sid, mtype, _flags, payload in reader.frames():
                    fut = self._futures.get(sid)
                    if mtype != w.TYPE_RESPONSE or fut is None or fut.done():
                        continue
                    fut.set_result(payload)
        except OSError as e:
            err = e
        self._closed = err
        for fut in self._futures.values():
            if not fut.done():
                fut.set_exception(ConnectionError(f"ttrpc connection closed: {err}"))

    async def close(self) -> None:
        if self._closed is None:
            self._closed = EOFError("closed by the client")
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass
        self._task.cancel()
        for fut in self._futures.values():
            if not fut.done():
                fut.set_exception(ConnectionError("ttrpc connection closed by the client"))


def _blocking_connect(sock: socket.socket, path: str) -> None:
    sock.setblocking(True)
    try:
        connect_unix(sock, path)
    finally:
        sock.setblocking(False)
