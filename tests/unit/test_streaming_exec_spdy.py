"""Exec over SPDY/3.1 against the real server, with host processes as the backend."""
from __future__ import annotations

import asyncio
import json
import os

import pytest

from cri_server.streaming import ExecRequest, TerminalSize
from tests.streaming_support.harness import run, serving
from tests.streaming_support.spdy_client import spdy_connect, spdy_exec
from tests.support.waiting import wait_for_async

SH = "sh"


def _exec(cmd: str, **kw: bool) -> ExecRequest:
    kw.setdefault("stdout", True)
    return ExecRequest("c1", (SH, "-c", cmd), **kw)


def _exit_code(error: bytes) -> int:
    """How client-go reads the v4 error stream."""
    doc = json.loads(error)
    if doc["status"] == "Success":
        return 0
    assert doc["reason"] == "NonZeroExitCode"
    (cause,) = [c for c in doc["details"]["causes"] if c["reason"] == "ExitCode"]
    return int(cause["message"])


def test_exec_non_tty_stdout_stderr_success():
    async def main():
        async with serving() as (srv, _):
            url = srv.get_exec_url(_exec("echo out; echo err >&2", stderr=True))
            res = await spdy_exec(url, stderr=True)
            assert (res.protocol, res.stdout, res.stderr) == ("v4.channel.k8s.io", b"out\n", b"err\n")
            assert res.error == b'{"metadata":{},"status":"Success"}'
    run(main)


@pytest.mark.parametrize("code", [1, 3, 42, 255])
def test_exec_exit_codes_v4(code):
    async def main():
        async with serving() as (srv, _):
            res = await spdy_exec(srv.get_exec_url(_exec(f"exit {code}")))
            assert _exit_code(res.error) == code
            assert f"exit code {code}".encode() in res.error
    run(main)


def test_exec_killed_by_signal_reports_128_plus_n():
    async def main():
        async with serving() as (srv, _):
            res = await spdy_exec(srv.get_exec_url(_exec("kill -9 $$")))
            assert _exit_code(res.error) == 137
    run(main)


@pytest.mark.parametrize("proto", ["v5.channel.k8s.io", "v4.channel.k8s.io", "v3.channel.k8s.io",
                                   "v2.channel.k8s.io", "channel.k8s.io"])
def test_error_stream_format_per_protocol_version(proto):
    async def main():
        async with serving() as (srv, _):
            ok = await spdy_exec(srv.get_exec_url(_exec("echo hi")), protocols=[proto])
            bad = await spdy_exec(srv.get_exec_url(_exec("exit 5")), protocols=[proto])
            assert ok.protocol == proto and ok.stdout == b"hi\n"
            if proto in ("v5.channel.k8s.io", "v4.channel.k8s.io"):
                assert _exit_code(ok.error) == 0 and _exit_code(bad.error) == 5
            else:  # v1-v3: plain text on failure, nothing on success
                assert ok.error == b""
                assert bad.error == b"command terminated with non-zero exit code: " \
                                    b"error executing command [sh -c exit 5], exit code 5"
    run(main)


def test_client_preference_order_wins_and_no_version_means_v1():
    async def main():
        async with serving() as (srv, _):
            res = await spdy_exec(srv.get_exec_url(_exec("true")),
                                  protocols=["v2.channel.k8s.io", "v4.channel.k8s.io"])
            assert res.protocol == "v2.channel.k8s.io"
            reply, client = await spdy_connect(srv.get_exec_url(_exec("true")), None)
            assert reply.status == 101 and reply.first("x-stream-protocol-version") is None
            await client.close()
    run(main)


def test_stdin_echo_and_close():
    async def main():
        async with serving() as (srv, be):
            data = os.urandom(300_000)
            res = await spdy_exec(srv.get_exec_url(_exec("cat; echo done >&2", stdin=True, stderr=True)), stdin=data, stderr=True)
            assert res.stdout == data and res.stderr == b"done\n" and _exit_code(res.error) == 0
    run(main)


def test_stdin_requested_but_closed_at_once():
    async def main():
        async with serving() as (srv, _):
            res = await spdy_exec(srv.get_exec_url(_exec("wc -c", stdin=True)), stdin=b"")
            assert res.stdout.strip() == b"0"
    run(main)


def test_stdin_held_open_then_closed():
    async def main():
        async with serving() as (srv, be):
            async def talk(client, streams):
                # The process is running and reading: a line goes through before stdin is closed.
                await streams["stdin"].send(b"first\n")
                got = await streams["stdout"].read_chunk()
                assert got == b"first\n"
            res = await spdy_exec(srv.get_exec_url(_exec("cat", stdin=True)), stdin=b"second\n", on_ready=talk)
            assert res.stdout == b"second\n" and _exit_code(res.error) == 0
    run(main)


def test_large_output_10mb():
    async def main():
        async with serving() as (srv, _):
            res = await spdy_exec(srv.get_exec_url(_exec("head -c 10485760 /dev/zero; echo x >&2", stderr=True)), stderr=True)
            assert len(res.stdout) == 10 * 1024 * 1024 and res.stdout.count(b"\0") == len(res.stdout)
            assert res.stderr == b"x\n" and _exit_code(res.error) == 0
    run(main)


def test_large_stdin_with_strict_flow_control_does_not_stall():
    # A client that honours SPDY/3.1 windows (64 KiB) can only send 10 MB if the server reopens them.
    async def main():
        async with serving() as (srv, _):
            data = os.urandom(10 * 1024 * 1024)
            res = await spdy_exec(srv.get_exec_url(_exec("md5sum", stdin=True)), stdin=data, honor_window=True)
            import hashlib
            assert res.stdout.split()[0].decode() == hashlib.md5(data).hexdigest()
    run(main)


def test_tty_exec_with_resize_reaching_the_backend():
    async def main():
        async with serving() as (srv, be):
            async def resize_then_ask(client, streams):
                await streams["resize"].send(b'{"Width":100,"Height":30}\n')
                await be.resize_seen.wait()
                await streams["stdin"].send(b"go\n")
            res = await spdy_exec(srv.get_exec_url(_exec("read x; stty size; exit 4", stdin=True, tty=True)),
                                  stdin=b"", close_stdin=False, tty=True, on_ready=resize_then_ask)
            assert be.resizes[0] == TerminalSize(100, 30)
            assert b"30 100" in res.stdout
            assert b"go" in res.stdout  # the terminal echoes input
            assert _exit_code(res.error) == 4
    run(main)


def test_tty_on_v2_has_no_resize_stream():
    async def main():
        async with serving() as (srv, _):
            res = await spdy_exec(srv.get_exec_url(_exec("tty >/dev/null && echo is-a-tty", tty=True)),
                                  protocols=["v2.channel.k8s.io"], tty=True)
            assert res.stdout.strip() == b"is-a-tty"
    run(main)


def test_concurrent_sessions():
    async def main():
        async with serving() as (srv, _):
            async def one(i: int):
                res = await spdy_exec(srv.get_exec_url(_exec(f"echo {i}; exit {i % 4}", stdin=True)), stdin=b"")
                return res.stdout, _exit_code(res.error)
            results = await asyncio.gather(*(one(i) for i in range(25)))
            assert results == [(f"{i}\n".encode(), i % 4) for i in range(25)]
    run(main)


def test_client_disconnect_mid_stream_is_seen_by_backend():
    async def main():
        async with serving() as (srv, be):
            reply, client = await spdy_connect(srv.get_exec_url(_exec("cat", stdin=True)), ["v4.channel.k8s.io"])
            await client.open_stream({"streamType": "error"})
            sin = await client.open_stream({"streamType": "stdin"})
            sout = await client.open_stream({"streamType": "stdout"})
            await sin.send(b"ping\n")
            assert await sout.read_chunk() == b"ping\n"
            await client.close()  # vanish without closing stdin
            await be.disconnect_seen.wait()
            # cat saw stdin EOF and exited: nothing is left running (checked by serving()).
            await wait_for_async(lambda: not srv.active_connections, 10, "the server to drop the connection",
                                 interval=0.01)
    run(main)


def test_server_stop_cancels_running_exec_and_kills_it():
    async def main():
        async with serving() as (srv, be):
            reply, client = await spdy_connect(srv.get_exec_url(_exec("sleep 600")), ["v4.channel.k8s.io"])
            await client.open_stream({"streamType": "error"})
            await client.open_stream({"streamType": "stdout"})
            await be.started.wait()
            await srv.stop()
            assert be.exec_cancelled == 1
            await client.eof.wait()
            await client.close()
    run(main)


def test_missing_streams_time_out_and_close():
    async def main():
        async with serving(stream_creation_timeout=0.2) as (srv, be):
            reply, client = await spdy_connect(srv.get_exec_url(_exec("true", stdin=True)), ["v4.channel.k8s.io"])
            await client.open_stream({"streamType": "error"})
            await client.eof.wait()  # the server gave up and closed without running anything
            await client.close()
            assert be.procs == []
    run(main)
