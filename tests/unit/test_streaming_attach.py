"""Attach over SPDY and WebSocket: live stdio of a running 'container' process, fan-out, detach."""
from __future__ import annotations

import json

from cri_server.streaming import AttachRequest
from tests.streaming_support.harness import run, serving
from tests.streaming_support.spdy_client import spdy_connect, spdy_exec
from tests.streaming_support.ws_client import STDIN, STDOUT, encode, ws_exec, ws_open
from tests.support.waiting import wait_for_async

ECHO = ["sh", "-c", "while read l; do echo got:$l; echo err:$l >&2; done"]


async def _attach_spdy(url: str, stderr: bool = True):
    reply, client = await spdy_connect(url, ["v4.channel.k8s.io"])
    assert reply.status == 101
    err = await client.open_stream({"streamType": "error"})
    sin = await client.open_stream({"streamType": "stdin"})
    sout = await client.open_stream({"streamType": "stdout"})
    serr = await client.open_stream({"streamType": "stderr"}) if stderr else None
    return client, err, sin, sout, serr


def test_attach_stdin_stdout_stderr_then_detach_keeps_container():
    async def main():
        async with serving() as (srv, be):
            c = await be.start_container("c2", ECHO)
            url = srv.get_attach_url(AttachRequest("c2", stdin=True, stdout=True, stderr=True))
            client, err, sin, sout, serr = await _attach_spdy(url)
            await sin.send(b"hello\n")
            assert await sout.read_chunk() == b"got:hello\n"
            assert await serr.read_chunk() == b"err:hello\n"
            await client.close()  # detach by going away
            await be.disconnect_seen.wait()
            assert c.proc.returncode is None, "detaching must not stop the container"
            # The container still works for the next session.
            client2, _, sin2, sout2, _ = await _attach_spdy(
                srv.get_attach_url(AttachRequest("c2", stdin=True, stdout=True, stderr=True)))
            await sin2.send(b"again\n")
            assert await sout2.read_chunk() == b"got:again\n"
            await client2.close()
    run(main)


def test_output_fans_out_to_every_attached_session():
    async def main():
        async with serving() as (srv, be):
            await be.start_container("c2", ECHO)
            a = await _attach_spdy(srv.get_attach_url(AttachRequest("c2", stdin=True, stdout=True, stderr=True)))
            ws = await ws_open(srv.get_attach_url(AttachRequest("c2", stdout=True)), ["v5.channel.k8s.io"])
            assert await ws.recv() == bytes([STDOUT])  # ready
            await wait_for_async(lambda: len(be.attachables["c2"].sinks) == 2, 10, "both sessions to attach",
                                 interval=0.01)
            await a[2].send(b"both\n")
            assert await a[3].read_chunk() == b"got:both\n"
            assert await ws.recv() == bytes([STDOUT]) + b"got:both\n"
            await ws.close()
            await a[0].close()
    run(main)


def test_attach_ends_with_success_when_the_container_exits():
    async def main():
        async with serving() as (srv, be):
            await be.start_container("c3", ["sh", "-c", "read l; echo bye:$l"])
            url = srv.get_attach_url(AttachRequest("c3", stdin=True, stdout=True))
            res = await spdy_exec(url, stdin=b"now\n")
            assert res.stdout == b"bye:now\n"
            assert json.loads(res.error) == {"metadata": {}, "status": "Success"}
            res = None
            await be.start_container("c4", ["sh", "-c", "read l; echo bye:$l"])
            wres = await ws_exec(srv.get_attach_url(AttachRequest("c4", stdin=True, stdout=True)), stdin=b"ws\n")
            assert wres.stdout == b"bye:ws\n" and json.loads(wres.error)["status"] == "Success"
    run(main)


def test_attach_backend_failure_is_an_internal_error_status():
    async def main():
        async with serving() as (srv, be):
            be.container_ids.add("no-stdio")
            res = await spdy_exec(srv.get_attach_url(AttachRequest("no-stdio", stdout=True)))
            doc = json.loads(res.error)
            assert doc["reason"] == "InternalError" and doc["code"] == 500
            assert doc["message"].startswith("Internal error occurred: error attaching to container: ")
    run(main)


def test_ws_attach_stdin_v4():
    async def main():
        async with serving() as (srv, be):
            await be.start_container("c2", ECHO)
            ws = await ws_open(srv.get_attach_url(AttachRequest("c2", stdin=True, stdout=True)), ["v4.channel.k8s.io"])
            assert await ws.recv() == bytes([STDOUT])
            await ws.send(encode("v4.channel.k8s.io", STDIN, b"w\n"))
            assert await ws.recv() == bytes([STDOUT]) + b"got:w\n"
            await ws.close()
            await be.disconnect_seen.wait()
    run(main)
