"""ttrpc framing, the server's handling of good and malformed input, and the clients (no root needed)."""
from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
import time

import pytest

from shim import ttrpc_wire as w
from shim.client import AsyncTtrpcClient, TaskClient, TtrpcClient, call_once
from tests.support.waiting import wait_for
from tests.support.waiting import wait_for_async
from shim.loop import Loop
from shim.pb import google, husk, rpc_status, task, ttrpc
from shim.ttrpc_server import PENDING, Server, Service, listen_unix


class FakeTask:
    """Answers Wait only when Kill is called (a deferred reply), State at once, Pids with an error."""

    def __init__(self) -> None:
        self.waiters: list = []

    def State(self, ctx, req):
        return task.StateResponse(id=req.id, pid=42, status=2)

    def Wait(self, ctx, req):
        self.waiters.append(ctx)
        return PENDING

    def Kill(self, ctx, req):
        for c in self.waiters:
            c.reply(task.WaitResponse(exit_status=req.signal))
        self.waiters.clear()
        return google.Empty()

    def Pids(self, ctx, req):
        raise w.TtrpcError(w.NOT_FOUND, f"container {req.id} not found")

    def Stats(self, ctx, req):
        raise RuntimeError("handler bug")

    def Connect(self, ctx, req):
        return task.ConnectResponse(shim_pid=os.getpid(), version=ctx.namespace)


@pytest.fixture
def server(tmp_path):
    path = str(tmp_path / "t.sock")
    loop = Loop()
    sock = listen_unix(path)
    srv = Server(loop, sock, [Service("containerd.task.v2.Task", task.SERVICES["containerd.task.v2.Task"],
                                      FakeTask())])
    stop = threading.Event()

    def run():
        while not stop.is_set():
            loop.run_once(0.05)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    yield path
    stop.set()
    t.join()
    srv.close()
    loop.close()


def raw_conn(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
    return s


def read_response(s: socket.socket) -> tuple[int, ttrpc.Response]:
    reader = w.FrameReader()
    while True:
        data = s.recv(65536)
        assert data, "server closed the connection"
        reader.feed(data)
        for sid, mtype, _flags, payload in reader.frames():
            assert mtype == w.TYPE_RESPONSE
            return sid, ttrpc.Response.decode(payload)


def test_header_layout():
    assert w.HEADER_SIZE == 10
    assert w.frame(3, w.TYPE_REQUEST, b"ab", 1) == b"\x00\x00\x00\x02\x00\x00\x00\x03\x01\x01ab"


def test_frame_reader_incremental_and_oversize():
    r = w.FrameReader(max_message=8)
    data = w.frame(1, 1, b"hello") + w.pack_header(20, 3, 1) + b"x" * 20 + w.frame(5, 1, b"")
    for i in range(len(data)):            # one byte at a time
        r.feed(data[i:i + 1])
    got = list(r.frames())
    assert got == [(1, 1, 0, b"hello"), (3, 1, 0, None), (5, 1, 0, b"")]


def test_unary_call_and_namespace(server):
    with TtrpcClient(server, namespace="k8s.io") as c:
        resp = c.call("containerd.task.v2.Task", "State", task.StateRequest(id="c1"), task.StateResponse)
        assert (resp.id, resp.pid, resp.status) == ("c1", 42, 2)
        conn = c.call("containerd.task.v2.Task", "Connect", task.ConnectRequest(), task.ConnectResponse)
        assert conn.version == "k8s.io"


def test_error_status_and_handler_bug(server):
    with TaskClient(server) as c:
        with pytest.raises(w.TtrpcError) as e:
            c.Pids(id="nope")
        assert e.value.code == w.NOT_FOUND and "nope" in e.value.message
        with pytest.raises(w.TtrpcError) as e:
            c.Stats(id="x")
        assert e.value.code == w.INTERNAL and "handler bug" in e.value.message
        assert c.State(id="still-alive").pid == 42


def test_unknown_service_and_method(server):
    with TtrpcClient(server) as c:
        with pytest.raises(w.TtrpcError) as e:
            c.call("no.such.Service", "X", google.Empty(), google.Empty)
        assert e.value.code == w.UNIMPLEMENTED
        with pytest.raises(w.TtrpcError) as e:
            c.call("containerd.task.v2.Task", "Nope", google.Empty(), google.Empty)
        assert e.value.code == w.UNIMPLEMENTED
        # Checkpoint exists in the service but FakeTask has no handler
        with pytest.raises(w.TtrpcError) as e:
            c.call("containerd.task.v2.Task", "Checkpoint", task.CheckpointTaskRequest(), google.Empty)
        assert e.value.code == w.UNIMPLEMENTED


def test_concurrent_inflight_deferred(server):
    """Several Waits stay pending while other calls are answered; Kill releases them all."""
    with TaskClient(server) as c:
        results = []

        def waiter():
            results.append(c.Wait(id="c").exit_status)

        threads = [threading.Thread(target=waiter) for _ in range(5)]
        for t in threads:
            t.start()
        # Other calls are not blocked by the pending Waits.
        for _ in range(20):
            assert c.State(id="c").pid == 42
        def all_returned() -> bool:   # Kill until every Wait is parked and has its answer
            c.Kill(id="c", signal=9)
            return len(results) == 5
        wait_for(all_returned, 10, lambda: f"5 Waits to return, have {results}", interval=0.01)
        for t in threads:
            t.join(10)
        assert results == [9] * 5


def test_malformed_payload_gets_invalid_argument(server):
    s = raw_conn(server)
    s.sendall(w.frame(1, w.TYPE_REQUEST, b"\xff\xff\xff"))           # truncated varint key
    sid, resp = read_response(s)
    assert sid == 1 and resp.status.code == w.INVALID_ARGUMENT
    inner = ttrpc.Request(service="containerd.task.v2.Task", method="State", payload=b"\x0a\x05ab").encode()
    s.sendall(w.frame(3, w.TYPE_REQUEST, inner))                      # length runs past the end
    sid, resp = read_response(s)
    assert sid == 3 and resp.status.code == w.INVALID_ARGUMENT
    bad_utf8 = ttrpc.Request(service="containerd.task.v2.Task", method="State",
                             payload=b"\x0a\x02\xff\xfe").encode()
    s.sendall(w.frame(5, w.TYPE_REQUEST, bad_utf8))
    sid, resp = read_response(s)
    assert sid == 5 and resp.status.code == w.INVALID_ARGUMENT and "UTF-8" in resp.status.message
    s.close()


def test_even_stream_id_and_reuse(server):
    s = raw_conn(server)
    req = ttrpc.Request(service="containerd.task.v2.Task", method="Wait",
                        payload=task.WaitRequest(id="x").encode()).encode()
    s.sendall(w.frame(2, w.TYPE_REQUEST, req))
    sid, resp = read_response(s)
    assert sid == 2 and resp.status.code == w.INVALID_ARGUMENT
    s.sendall(w.frame(7, w.TYPE_REQUEST, req))                        # pending Wait on stream 7
    s.sendall(w.frame(7, w.TYPE_REQUEST, req))                        # reused while in flight
    sid, resp = read_response(s)
    assert sid == 7 and resp.status.code == w.INVALID_ARGUMENT and "in use" in resp.status.message
    s.close()


def test_oversize_message_resource_exhausted_connection_survives(server):
    s = raw_conn(server)
    big = w.MAX_MESSAGE + 1
    s.sendall(w.pack_header(big, 1, w.TYPE_REQUEST))
    chunk = b"\0" * 65536
    left = big
    while left:
        n = min(left, len(chunk))
        s.sendall(chunk[:n])
        left -= n
    sid, resp = read_response(s)
    assert sid == 1 and resp.status.code == w.RESOURCE_EXHAUSTED
    ok = ttrpc.Request(service="containerd.task.v2.Task", method="State",
                       payload=task.StateRequest(id="after").encode()).encode()
    s.sendall(w.frame(3, w.TYPE_REQUEST, ok))
    sid, resp = read_response(s)
    assert sid == 3 and resp.status is None and task.StateResponse.decode(resp.payload).id == "after"
    s.close()


def test_garbage_and_abrupt_close_do_not_kill_server(server):
    for junk in (b"\x00", os.urandom(3), w.pack_header(100, 1, 1) + b"short", w.frame(9, 0x7f, b"??"),
                 w.frame(11, w.TYPE_DATA, b"data for nobody")):
        s = raw_conn(server)
        s.sendall(junk)
        s.close()
    assert call_once(server, "containerd.task.v2.Task", "State", task.StateRequest(id="ok"),
                     task.StateResponse).pid == 42


def test_client_sees_server_close(tmp_path):
    path = str(tmp_path / "x.sock")
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    lsock.listen(1)
    c = TtrpcClient(path)
    conn, _ = lsock.accept()
    conn.close()
    with pytest.raises(ConnectionError):
        c.call("a", "b", google.Empty(), google.Empty, timeout=5)
    c.close()
    lsock.close()


def test_async_client(server):
    async def main():
        c = await AsyncTtrpcClient.connect(server)
        wait = asyncio.ensure_future(c.task("Wait", id="c"))
        st = await c.task("State", id="c")
        assert st.pid == 42
        async def answered() -> bool:   # Kill answers the Waits parked by then: until ours is one of them
            await c.task("Kill", id="c", signal=15)
            await asyncio.sleep(0)
            return wait.done()
        await wait_for_async(answered, 10, "the pending Wait to be answered", interval=0.01)
        assert wait.result().exit_status == 15
        with pytest.raises(w.TtrpcError):
            await c.task("Pids", id="zz")
        await c.close()

    asyncio.run(main())


def test_status_roundtrip():
    st = rpc_status.Status(code=5, message="x", details=[google.Any(type_url="t", value=b"v")])
    assert rpc_status.Status.decode(st.encode()) == st
    r = husk.AttachInfoResponse(path="/p")
    assert husk.AttachInfoResponse.decode(r.encode()).path == "/p"
    assert struct.unpack(">I", w.frame(1, 1, b"")[:4]) == (0,)


def test_call_task_once_resolves_the_method_and_its_types(server):
    from shim.client import call_task_once, resolve
    assert resolve("containerd.task.v2.Task", "State") == (task.StateRequest, task.StateResponse)
    assert resolve("husk.shim.v1.Shim", "AttachInfo")[1] is husk.AttachInfoResponse
    assert call_task_once(server, "State", timeout=5, id="c").pid == 42
    with pytest.raises(w.TtrpcError) as e:
        call_task_once(server, "Pids", timeout=5, id="zz")
    assert e.value.code == w.NOT_FOUND


def _oversize_answerer(path: str) -> threading.Thread:
    """A server that answers its one request (stream 1) with a frame over the clients' size limit."""
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    lsock.listen(1)

    def run():
        conn, _ = lsock.accept()
        reader = w.FrameReader()
        while not list(reader.frames()):
            reader.feed(conn.recv(65536))
        conn.sendall(w.pack_header(w.MAX_MESSAGE + 1, 1, w.TYPE_RESPONSE) + bytes(w.MAX_MESSAGE + 1))
        conn.recv(1)            # until the client closes
        conn.close()
        lsock.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_both_clients_report_an_oversize_answer_as_resource_exhausted(tmp_path):
    t = _oversize_answerer(str(tmp_path / "a.sock"))
    c = TtrpcClient(str(tmp_path / "a.sock"))
    with pytest.raises(w.TtrpcError) as e:
        c.call("containerd.task.v2.Task", "State", task.StateRequest(id="x"), task.StateResponse, timeout=10)
    assert e.value.code == w.RESOURCE_EXHAUSTED
    c.close()
    t.join(10)

    async def main():
        t2 = _oversize_answerer(str(tmp_path / "b.sock"))
        c = await AsyncTtrpcClient.connect(str(tmp_path / "b.sock"))
        with pytest.raises(w.TtrpcError) as e:
            await c.task("State", timeout=10, id="x")
        assert e.value.code == w.RESOURCE_EXHAUSTED
        assert not c.closed
        await c.close()
        assert c.closed
        t2.join(10)

    asyncio.run(main())
