"""shim/attach.py's two clients (blocking AttachClient, asyncio AsyncAttachClient) against a real AttachServer:
the same packets both ways, long stdin split, resize, close, the exit status (no root needed)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from shim import attach
from shim.loop import Loop


@pytest.fixture
def server(tmp_path):
    got: list[tuple[str, object]] = []
    loop = Loop()
    srv = attach.AttachServer(loop, str(tmp_path / "a.sock"), on_stdin=lambda d: got.append(("stdin", d)),
                              on_resize=lambda w, h: got.append(("resize", (w, h))),
                              on_close_stdin=lambda: got.append(("close", None)))
    stop = threading.Event()
    calls: list = []            # functions to run on the loop's thread

    def run():
        while not stop.is_set():
            loop.run_once(0.02)
            while calls:
                calls.pop(0)()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    yield srv, got, calls
    stop.set()
    t.join()
    srv.sock.close()
    loop.close()


def _wait(cond, what: str) -> None:
    from tests.support.waiting import wait_for
    wait_for(cond, timeout=10, what=what)


def test_packet_helpers():
    big = bytes(attach.MAX_PACKET + 10)
    pkts = attach.stdin_packets(big)
    assert [len(p) for p in pkts] == [attach.MAX_PACKET, 12] and all(p[0] == attach.STDIN for p in pkts)
    assert attach.resize_packet(80, 24) == b"\x01\x00\x50\x00\x18"
    assert attach.exit_status(b"\x00\x00\x01\x02") == 258 and attach.exit_status(b"\x01") is None


def test_blocking_client(server):
    srv, got, calls = server
    c = attach.AttachClient(srv.path)
    _wait(lambda: srv.clients, "the client accepted")
    c.write_stdin(b"x" * attach.MAX_PACKET)
    c.resize(100, 40)
    c.close_stdin()
    _wait(lambda: len(got) == 4, "four client packets")
    assert got == [("stdin", b"x" * (attach.MAX_PACKET - 1)), ("stdin", b"x"), ("resize", (100, 40)),
                   ("close", None)]
    calls.append(lambda: (srv.broadcast(attach.STDOUT, b"out"), srv.broadcast(attach.STDERR, b"err"),
                          srv.exited(7)))
    assert c.read_all() == (b"out", b"err", 7)
    c.close()


def test_async_client(server):
    srv, got, calls = server

    async def main():
        c = await attach.AsyncAttachClient.connect(srv.path)
        await c.write_stdin(b"hello")
        await c.resize(3, 4)
        await c.close_stdin()
        for _ in range(1000):       # the shim read all three packets (so it accepted the client): then output
            if len(got) == 3:
                break
            await asyncio.sleep(0.01)
        calls.append(lambda: (srv.broadcast(attach.STDOUT, b"o"), srv.exited(3)))
        msgs = []
        while (m := await c.recv()) is not None:
            msgs.append(m)
        c.close()
        assert await c.recv() is None
        return msgs

    msgs = asyncio.run(main())
    assert msgs == [(attach.STDOUT, b"o"), (attach.EXIT, b"\x00\x00\x00\x03")]
    assert got == [("stdin", b"hello"), ("resize", (3, 4)), ("close", None)]


def test_connect_failure_leaks_no_socket(tmp_path):
    import os
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(FileNotFoundError):
        attach.connect(str(tmp_path / "none.sock"), 1.0)
    assert len(os.listdir("/proc/self/fd")) == before
