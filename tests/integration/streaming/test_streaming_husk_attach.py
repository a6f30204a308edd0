"""Attach through the real stack: the container's live stdio held by its husk-shim, reached over SPDY and
WebSocket. Detaching leaves the container running; the session ends when the container exits."""
from __future__ import annotations

import asyncio
import json

import pytest

from cri_server.streaming import AttachRequest
from shim.pb import task_types
from tests.shim_fixtures import runtimes_available
from tests.streaming_support.harness import run
from tests.streaming_support.shim_pods import Targets, serving, start_container, stop_container, wait_until
from tests.streaming_support.spdy_client import spdy_connect, spdy_exec
from tests.streaming_support.ws_client import STDIN, STDOUT, decode, encode, ws_exec, ws_open
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.root
S = task_types.Status
ECHO = ["sh", "-c", "while read l; do echo got:$l; echo err:$l >&2; done"]


@pytest.fixture(params=runtimes_available())
def containers(request, tmp_path):
    made = []

    def make(args, **kw):
        c = start_container(str(tmp_path), args, runtime=request.param, **kw)
        made.append(c)
        return c
    yield make
    for c in made:
        stop_container(c)


async def _attach_spdy(url: str, stderr: bool = True):
    reply, client = await spdy_connect(url, ["v4.channel.k8s.io"])
    assert reply.status == 101, reply
    err = await client.open_stream({"streamType": "error"})
    sin = await client.open_stream({"streamType": "stdin"})
    sout = await client.open_stream({"streamType": "stdout"})
    serr = await client.open_stream({"streamType": "stderr"}) if stderr else None
    return client, err, sin, sout, serr


def test_attach_write_read_detach_reattach(containers):
    box = containers(ECHO, stdin=True)
    targets = Targets()
    targets.add(box)

    async def main():
        async with serving(targets, (box,), own_children=True) as srv:
            client, err, sin, sout, serr = await _attach_spdy(
                srv.get_attach_url(AttachRequest(box.cid, stdin=True, stdout=True, stderr=True)))
            await sin.send(b"hello\n")
            assert await sout.read_chunk() == b"got:hello\n"
            assert await serr.read_chunk() == b"err:hello\n"
            await client.close()  # detach by going away
            await wait_until(lambda: box.pids() == [box.init_pid] and box.status() == S.RUNNING,
                             "the container to run on after the detach")
            # A second session over WebSocket reaches the same live stdin.
            ws = await ws_open(srv.get_attach_url(AttachRequest(box.cid, stdin=True, stdout=True)),
                               ["v5.channel.k8s.io"])
            assert decode(ws.subprotocol, await ws.recv()) == (STDOUT, b"")
            await ws.send(encode(ws.subprotocol, STDIN, b"again\n"))
            assert decode(ws.subprotocol, await ws.recv()) == (STDOUT, b"got:again\n")
            await ws.close()
        assert box.status() == S.RUNNING
    run(main)


def test_attach_output_fans_out_to_two_sessions(containers):
    box = containers(ECHO, stdin=True)
    targets = Targets()
    targets.add(box)

    async def main():
        async with serving(targets, (box,), own_children=True) as srv:
            a = await _attach_spdy(srv.get_attach_url(AttachRequest(box.cid, stdin=True, stdout=True, stderr=True)))
            ws = await ws_open(srv.get_attach_url(AttachRequest(box.cid, stdout=True)), ["v4.channel.k8s.io"])
            assert decode(ws.subprotocol, await ws.recv()) == (STDOUT, b"")
            got = bytearray()

            async def collect() -> None:
                async for msg in ws:
                    got.extend(decode(ws.subprotocol, msg)[1])
            reader = asyncio.create_task(collect())
            # The WebSocket session is attached once a line sent through the first one reaches it;
            # lines sent before that are not for it (attach shows live output only).
            syncs = 0

            async def synced() -> bool:
                nonlocal syncs
                if b"got:sync" in got:
                    return True
                await a[2].send(b"sync\n")
                syncs += 1
                return False
            await wait_for_async(synced, 30, "a sync line to reach the WebSocket session")
            await a[2].send(b"both\n")
            await wait_for_async(lambda: got.endswith(b"got:both\n"), 30, lambda: f"got:both, have {bytes(got)!r}",
                                 interval=0.01)
            # The first session saw everything: every sync's answer (more than one were sent when the second
            # session attached late, on a loaded machine), then both's, however the output was chunked.
            first = bytearray()
            while not first.endswith(b"got:both\n"):
                chunk = await a[3].read_chunk()
                assert chunk is not None, bytes(first)
                first += chunk
            assert bytes(first) == b"got:sync\n" * syncs + b"got:both\n"
            await ws.close()
            await reader
            await a[0].close()
    run(main)


def test_attach_ends_when_the_container_exits(containers):
    box = containers(["sh", "-c", "read l; echo bye:$l"], stdin=True)
    box2 = containers(["sh", "-c", "read l; echo bye:$l"], stdin=True)
    targets = Targets()
    targets.add(box)
    targets.add(box2)

    async def main():
        async with serving(targets, (box, box2), own_children=True) as srv:
            res = await spdy_exec(srv.get_attach_url(AttachRequest(box.cid, stdin=True, stdout=True)),
                                  stdin=b"now\n", close_stdin=False)
            assert res.stdout == b"bye:now\n"
            assert json.loads(res.error) == {"metadata": {}, "status": "Success"}
            wres = await ws_exec(srv.get_attach_url(AttachRequest(box2.cid, stdin=True, stdout=True)),
                                 stdin=b"ws\n", close_stdin=False)
            assert wres.stdout == b"bye:ws\n" and json.loads(wres.error)["status"] == "Success"
        await wait_until(lambda: box.status() == S.STOPPED and box2.status() == S.STOPPED, "both containers to exit")
    run(main)


def test_attach_stdin_once_closes_stdin_at_the_end_of_input(containers):
    """A non-TTY StdinOnce container loses its stdin when the attached client ends it (containerd's rule):
    cat sees EOF, the container exits, the session ends with success."""
    box = containers(["cat"], stdin=True, stdin_once=True)
    targets = Targets()
    targets.add(box)

    async def main():
        async with serving(targets, (box,), own_children=True) as srv:
            res = await spdy_exec(srv.get_attach_url(AttachRequest(box.cid, stdin=True, stdout=True)),
                                  stdin=b"once\n")
            assert res.stdout == b"once\n" and json.loads(res.error)["status"] == "Success"
        await wait_until(lambda: box.status() == S.STOPPED, "the container to exit")
    run(main)


def test_attach_without_stdin_once_keeps_stdin_open(containers):
    box = containers(ECHO, stdin=True)
    targets = Targets()
    targets.add(box)

    async def main():
        async with serving(targets, (box,), own_children=True) as srv:
            client, err, sin, sout, serr = await _attach_spdy(
                srv.get_attach_url(AttachRequest(box.cid, stdin=True, stdout=True, stderr=True)))
            await sin.send(b"a\n", fin=True)  # this client is done writing; the container's stdin stays open
            assert await sout.read_chunk() == b"got:a\n"
            await client.close()
            client, err, sin, sout, serr = await _attach_spdy(
                srv.get_attach_url(AttachRequest(box.cid, stdin=True, stdout=True, stderr=True)))
            await sin.send(b"b\n")
            assert await sout.read_chunk() == b"got:b\n"
            await client.close()
        assert box.status() == S.RUNNING
    run(main)


def test_attach_tty_with_resize(containers):
    box = containers(["sh", "-c", "while read l; do stty size; done"], tty=True, stdin=True)
    targets = Targets()
    targets.add(box)

    async def main():
        async with serving(targets, (box,), own_children=True) as srv:
            reply, client = await spdy_connect(
                srv.get_attach_url(AttachRequest(box.cid, tty=True, stdin=True, stdout=True)), ["v4.channel.k8s.io"])
            await client.open_stream({"streamType": "error"})
            sin = await client.open_stream({"streamType": "stdin"})
            sout = await client.open_stream({"streamType": "stdout"})
            rsz = await client.open_stream({"streamType": "resize"})
            await rsz.send(b'{"Width":90,"Height":33}')
            seen = bytearray()
            while b"33 90" not in seen:
                await sin.send(b"\n")
                chunk = await sout.read_chunk()
                assert chunk is not None
                seen += chunk
            await client.close()
        assert box.status() == S.RUNNING
    run(main)


def test_attach_to_unknown_or_stopped_container(containers):
    box = containers(["sleep", "100000"])
    targets = Targets()
    targets.add(box, running=False)

    async def main():
        async with serving(targets, (box,), own_children=True) as srv:
            for cid, status in ((box.cid, 409), ("hstrm-nope", 404)):
                reply, client = await spdy_connect(srv.get_attach_url(AttachRequest(cid, stdout=True)),
                                                   ["v4.channel.k8s.io"])
                assert client is None and reply.status == status
    run(main)
