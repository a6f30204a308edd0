"""Exec over WebSocket channel protocols against the real server (the `websockets` library as client)."""
from __future__ import annotations

import asyncio
import base64
import json
import os

import pytest
from websockets.exceptions import InvalidStatus

from cri_server.streaming import ExecRequest, TerminalSize
from tests.streaming_support.harness import run, serving
from tests.streaming_support.ws_client import RESIZE, STDIN, STDOUT, encode, ws_exec, ws_open
from tests.support.waiting import wait_for_async


def _exec(cmd: str, **kw: bool) -> ExecRequest:
    kw.setdefault("stdout", True)
    return ExecRequest("c1", ("sh", "-c", cmd), **kw)


def _code(error: bytes) -> int:
    doc = json.loads(error)
    if doc["status"] == "Success":
        return 0
    return int([c for c in doc["details"]["causes"] if c["reason"] == "ExitCode"][0]["message"])


@pytest.mark.parametrize("proto", ["v5.channel.k8s.io", "v4.channel.k8s.io", "v4.base64.channel.k8s.io"])
def test_exec_json_status_protocols(proto):
    async def main():
        async with serving() as (srv, _):
            ok = await ws_exec(srv.get_exec_url(_exec("echo out; echo err >&2", stderr=True)), protocols=[proto])
            assert (ok.protocol, ok.stdout, ok.stderr, _code(ok.error)) == (proto, b"out\n", b"err\n", 0)
            assert ok.first_message == (STDOUT, b""), "kubelet's 'ready' message on the first output channel"
            assert ok.close_code == 1000
            bad = await ws_exec(srv.get_exec_url(_exec("exit 9")), protocols=[proto])
            assert _code(bad.error) == 9
    run(main)


@pytest.mark.parametrize("proto", ["channel.k8s.io", "base64.channel.k8s.io", None])
def test_exec_v1_text_status_protocols(proto):
    async def main():
        async with serving() as (srv, _):
            ok = await ws_exec(srv.get_exec_url(_exec("printf hi")), protocols=[proto] if proto else [])
            assert ok.protocol == proto and ok.stdout == b"hi" and ok.error == b""
            bad = await ws_exec(srv.get_exec_url(_exec("exit 2")), protocols=[proto] if proto else [])
            assert bad.error.endswith(b"exit code 2")
    run(main)


def test_first_message_goes_to_stderr_or_error_channel_without_stdout():
    async def main():
        async with serving() as (srv, _):
            res = await ws_exec(srv.get_exec_url(ExecRequest("c1", ("true",), stderr=True)), protocols=["v4.channel.k8s.io"])
            assert res.first_message == (2, b"")
            res = await ws_exec(srv.get_exec_url(ExecRequest("c1", ("true",), stdin=True)),
                                protocols=["v4.channel.k8s.io"], stdin=b"")
            assert res.first_message == (3, b"")
    run(main)


def test_v5_stdin_echo_and_close_signal():
    async def main():
        async with serving() as (srv, _):
            data = os.urandom(200_000)
            res = await ws_exec(srv.get_exec_url(_exec("cat", stdin=True)), stdin=data)
            assert res.stdout == data and _code(res.error) == 0
    run(main)


def test_base64_stdin():
    async def main():
        async with serving() as (srv, _):
            async def send(ws, proto):
                await ws.send(encode(proto, STDIN, b"abc\n"))
                await ws.send("0" + base64.b64encode(b"def\n").decode())
            res = await ws_exec(srv.get_exec_url(_exec("head -n 2", stdin=True)),
                                protocols=["v4.base64.channel.k8s.io"], on_open=send)
            assert res.stdout == b"abc\ndef\n"
    run(main)


def test_large_output_10mb():
    async def main():
        async with serving() as (srv, _):
            res = await ws_exec(srv.get_exec_url(_exec("head -c 10485760 /dev/urandom | od -An -v -tx1 | head -c 10485760")))
            assert len(res.stdout) == 10 * 1024 * 1024 and _code(res.error) == 0
    run(main)


def test_tty_resize_reaches_backend():
    async def main():
        async with serving() as (srv, be):
            async def resize_then_go(ws, proto):
                await ws.send(encode(proto, RESIZE, b'{"Width":120,"Height":40}'))
                await be.resize_seen.wait()
                await ws.send(encode(proto, STDIN, b"go\n"))
            res = await ws_exec(srv.get_exec_url(_exec("read x; stty size", stdin=True, tty=True)),
                                close_stdin=False, on_open=resize_then_go)
            assert be.resizes == [TerminalSize(120, 40)]
            assert b"40 120" in res.stdout and _code(res.error) == 0
    run(main)


def test_client_disconnect_is_seen_by_backend():
    async def main():
        async with serving() as (srv, be):
            ws = await ws_open(srv.get_exec_url(_exec("cat", stdin=True)), ["v4.channel.k8s.io"])
            await ws.recv()  # ready message
            await ws.send(encode("v4.channel.k8s.io", STDIN, b"x\n"))
            assert await ws.recv() == bytes([STDOUT]) + b"x\n"
            ws.transport.abort()  # vanish without a close handshake
            await be.disconnect_seen.wait()
            await wait_for_async(lambda: not srv.active_connections, 10, "the server to drop the connection",
                                 interval=0.01)
    run(main)


def test_unsupported_subprotocol_is_403():
    async def main():
        async with serving() as (srv, be):
            with pytest.raises(InvalidStatus) as e:
                await ws_open(srv.get_exec_url(_exec("true")), ["v9.channel.k8s.io"])
            assert e.value.response.status_code == 403
            assert b"not supported" in e.value.response.body
            assert be.procs == []
    run(main)


def test_concurrent_ws_and_spdy_sessions():
    from tests.streaming_support.spdy_client import spdy_exec

    async def main():
        async with serving() as (srv, _):
            async def one(i: int):
                url = srv.get_exec_url(_exec(f"echo {i}"))
                res = await (ws_exec(url) if i % 2 else spdy_exec(url))
                return res.stdout
            assert await asyncio.gather(*(one(i) for i in range(20))) == [f"{i}\n".encode() for i in range(20)]
    run(main)


def test_idle_websocket_is_closed():
    async def main():
        async with serving(stream_idle_timeout=0.2) as (srv, be):
            ws = await ws_open(srv.get_exec_url(_exec("cat", stdin=True)), ["v4.channel.k8s.io"])
            await ws.recv()  # ready
            await ws.wait_closed()  # nothing happened for a while: the server hung up
            await be.disconnect_seen.wait()
    run(main)
