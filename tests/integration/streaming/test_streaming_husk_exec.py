"""Exec through the real stack: SPDY and WebSocket clients -> StreamingServer -> HuskStreamBackend ->
husk-shim (runc) -> a busybox container. Every test ends with the container back to its init alone and
no exec left in the shim."""
from __future__ import annotations

import asyncio
import json
import os

import pytest

from cri_server.streaming import ExecRequest
from tests.shim_fixtures import runtimes_available
from tests.streaming_support.harness import run
from tests.streaming_support.shim_pods import MARK, Targets, assert_no_leaks, serving, start_container, \
    stop_container, wait_until
from tests.streaming_support.spdy_client import spdy_connect, spdy_exec
from tests.streaming_support.ws_client import STDIN, STDOUT, decode, encode, ws_exec, ws_open

pytestmark = pytest.mark.root


@pytest.fixture(scope="module", params=runtimes_available())
def box(request, tmp_path_factory):
    """One long-running container per runtime, shared by the exec tests (each test checks it is left clean)."""
    c = start_container(str(tmp_path_factory.mktemp("hstrm-exec")), ["sleep", "100000"], runtime=request.param)
    yield c
    stop_container(c)


@pytest.fixture
def targets(box):
    t = Targets()
    t.add(box)
    return t


def _status(raw: bytes) -> dict:
    return json.loads(raw) if raw else {}


def test_exec_spdy_stdout_stderr_exit_code(box, targets):
    async def main():
        async with serving(targets, (box,)) as srv:
            url = srv.get_exec_url(ExecRequest(box.cid, ("sh", "-c", "echo out; echo err >&2; exit 3"),
                                               stdout=True, stderr=True))
            res = await spdy_exec(url, stderr=True)
            assert res.protocol == "v4.channel.k8s.io"
            assert res.stdout == b"out\n" and res.stderr == b"err\n"
            st = _status(res.error)
            assert st["status"] == "Failure" and st["reason"] == "NonZeroExitCode"
            assert st["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]
            ok = await spdy_exec(srv.get_exec_url(ExecRequest(box.cid, ("true",), stdout=True)))
            assert _status(ok.error) == {"metadata": {}, "status": "Success"}
    run(main)


def test_exec_websocket_v5_and_v4(box, targets):
    async def main():
        async with serving(targets, (box,)) as srv:
            for proto in ("v5.channel.k8s.io", "v4.channel.k8s.io", "v4.base64.channel.k8s.io"):
                url = srv.get_exec_url(ExecRequest(box.cid, ("sh", "-c", "echo o; echo e >&2; exit 5"),
                                                   stdout=True, stderr=True))
                res = await ws_exec(url, protocols=[proto])
                assert res.protocol == proto
                assert (res.stdout, res.stderr) == (b"o\n", b"e\n")
                assert _status(res.error)["details"]["causes"][0]["message"] == "5"
    run(main)


def test_exec_old_protocols_report_text_errors(box, targets):
    async def main():
        async with serving(targets, (box,)) as srv:
            url = srv.get_exec_url(ExecRequest(box.cid, ("sh", "-c", "exit 2"), stdout=True))
            res = await spdy_exec(url, protocols=["v3.channel.k8s.io"])
            assert res.protocol == "v3.channel.k8s.io"
            assert b"exit code 2" in res.error
    run(main)


def test_exec_takes_the_container_process_settings(box, targets):
    """env, cwd and user come from the container's process in its bundle, as containerd does it."""
    async def main():
        async with serving(targets, (box,)) as srv:
            url = srv.get_exec_url(ExecRequest(box.cid, ("sh", "-c", "env; pwd; id -u"), stdout=True))
            res = await spdy_exec(url)
            lines = res.stdout.decode().splitlines()
            assert MARK in lines and "PATH=/bin" in lines
            assert lines[-2:] == ["/tmp", "0"]
            assert "TERM=xterm" in lines  # make_bundle puts it in the container's env
    run(main)


def test_exec_signal_exit_code(box, targets):
    async def main():
        async with serving(targets, (box,)) as srv:
            res = await spdy_exec(srv.get_exec_url(ExecRequest(box.cid, ("sh", "-c", "kill -9 $$"), stdout=True)))
            assert _status(res.error)["details"]["causes"][0]["message"] == "137"
    run(main)


@pytest.mark.parametrize("transport", ["spdy", "ws"])
def test_exec_10mb_output(box, targets, transport):
    n = 10 * 1000 * 1000
    cmd = ("sh", "-c", f"yes 0123456789abcdef | head -c {n}; echo end >&2")

    async def main():
        async with serving(targets, (box,)) as srv:
            url = srv.get_exec_url(ExecRequest(box.cid, cmd, stdout=True, stderr=True))
            if transport == "spdy":
                res = await spdy_exec(url, stderr=True)
            else:
                res = await ws_exec(url)
            assert len(res.stdout) == n
            assert res.stdout == (b"0123456789abcdef\n" * (n // 17 + 1))[:n]
            assert res.stderr == b"end\n"
            assert _status(res.error).get("status") == "Success"
    run(main)


def test_exec_stdin_echo_and_close(box, targets):
    data = b"".join(b"line %d\n" % i for i in range(20000))

    async def main():
        async with serving(targets, (box,)) as srv:
            res = await spdy_exec(srv.get_exec_url(ExecRequest(box.cid, ("cat",), stdin=True, stdout=True)),
                                  stdin=data)
            assert res.stdout == data and _status(res.error)["status"] == "Success"
            wres = await ws_exec(srv.get_exec_url(ExecRequest(box.cid, ("wc", "-c"), stdin=True, stdout=True)),
                                 stdin=data)
            assert wres.stdout.split() == [str(len(data)).encode()]
    run(main)


def test_exec_without_stdin_sees_eof(box, targets):
    async def main():
        async with serving(targets, (box,)) as srv:
            res = await spdy_exec(srv.get_exec_url(ExecRequest(box.cid, ("sh", "-c", "cat; echo eof"), stdout=True)))
            assert res.stdout == b"eof\n"
    run(main)


def test_exec_tty_with_resize_spdy(box, targets):
    """The initial size and later changes reach the process's terminal (stty size reads them)."""
    async def main():
        async with serving(targets, (box,)) as srv:
            url = srv.get_exec_url(ExecRequest(box.cid, ("sh", "-c", "while read l; do stty size; done"),
                                               tty=True, stdin=True, stdout=True))
            reply, client = await spdy_connect(url, ["v4.channel.k8s.io"])
            err = await client.open_stream({"streamType": "error"})
            sin = await client.open_stream({"streamType": "stdin"})
            sout = await client.open_stream({"streamType": "stdout"})
            rsz = await client.open_stream({"streamType": "resize"})
            seen = bytearray()

            async def until(text: bytes) -> None:
                # Resizes and stdin travel separately (ResizePty vs the attach socket): ask again until
                # the terminal shows the size.
                while text not in seen:
                    await sin.send(b"\n")
                    chunk = await sout.read_chunk()
                    assert chunk is not None, f"output ended before {text!r}: {bytes(seen)!r}"
                    seen.extend(chunk)
            await rsz.send(b'{"Width":101,"Height":31}')
            await until(b"31 101")
            await rsz.send(b'{"Width":132,"Height":43}\n')
            await until(b"43 132")
            await sin.close()  # ^D on the terminal: the loop ends
            rest = await sout.read_all()
            assert b"\r\n" in seen + rest  # a terminal's line endings
            assert _status(await err.read_all())["status"] == "Success"
            await client.close()
    run(main)


def test_exec_tty_websocket_term_and_resize(box, targets):
    async def main():
        async with serving(targets, (box,)) as srv:
            url = srv.get_exec_url(ExecRequest(box.cid, ("sh", "-c", "echo $TERM; while read l; do stty size; done"),
                                               tty=True, stdin=True, stdout=True))
            ws = await ws_open(url, ["v5.channel.k8s.io"])
            proto = ws.subprotocol
            assert decode(proto, await ws.recv()) == (STDOUT, b"")
            await ws.send(encode(proto, 4, b'{"Width":77,"Height":22}'))
            seen = bytearray()
            while b"22 77" not in seen:
                await ws.send(encode(proto, STDIN, b"\n"))
                ch, data = decode(proto, await ws.recv())
                seen.extend(data if ch == STDOUT else b"")
            # The terminal echoes the newlines sent meanwhile, so TERM's line may follow some "\r\n".
            assert seen.lstrip(b"\r\n").startswith(b"xterm\r\n")
            await ws.send(bytes((255, STDIN)))
            statuses = []
            async for msg in ws:
                ch, data = decode(proto, msg)
                if ch == 3:
                    statuses.append(data)
            assert _status(b"".join(statuses))["status"] == "Success"
    run(main)


def test_concurrent_sessions(box, targets):
    async def main():
        async with serving(targets, (box,)) as srv:
            async def one(i: int) -> None:
                payload = f"session {i}\n".encode() * 500
                url = srv.get_exec_url(ExecRequest(box.cid, ("sh", "-c", f"cat; echo done-{i} >&2"),
                                                   stdin=True, stdout=True, stderr=True))
                if i % 2:
                    res = await spdy_exec(url, stdin=payload, stderr=True)
                else:
                    res = await ws_exec(url, stdin=payload)
                assert res.stdout == payload and res.stderr == f"done-{i}\n".encode()
            await asyncio.gather(*(one(i) for i in range(10)))
    run(main)


def test_client_disconnect_lets_the_process_finish(box, targets):
    """kubelet's behaviour: a client that goes away closes the process's stdin; the process runs to its
    end (here: it writes a marker file after stdin EOF and keeps producing output nobody reads)."""
    marker = f"gone-{os.getpid()}-{id(box):x}"

    async def main():
        async with serving(targets, (box,)) as srv:
            cmd = ("sh", "-c", f"cat; i=0; while [ $i -lt 3000 ]; do echo line $i; i=$((i+1)); done; "
                               f"echo ok > /tmp/{marker}")
            url = srv.get_exec_url(ExecRequest(box.cid, cmd, stdin=True, stdout=True))
            reply, client = await spdy_connect(url, ["v4.channel.k8s.io"])
            await client.open_stream({"streamType": "error"})
            sin = await client.open_stream({"streamType": "stdin"})
            sout = await client.open_stream({"streamType": "stdout"})
            await sin.send(b"first\n")
            assert await sout.read_chunk() == b"first\n"
            await client.close()  # gone mid-stream, stdin never closed
            path = os.path.join(box.rootfs, "tmp", marker)
            await wait_until(lambda: os.path.exists(path), "the exec to finish after the client left")
            await wait_until(lambda: not box.leftover_execs(), "the exec to be deleted")
            with open(path) as f:
                assert f.read() == "ok\n"
            os.unlink(path)
    run(main)


def test_server_stop_kills_running_exec(box, targets):
    async def main():
        async with serving(targets, (box,)) as srv:
            url = srv.get_exec_url(ExecRequest(box.cid, ("sh", "-c", "sleep 100000 & sleep 100000"), stdout=True))
            reply, client = await spdy_connect(url, ["v4.channel.k8s.io"])
            await client.open_stream({"streamType": "error"})
            await client.open_stream({"streamType": "stdout"})
            # busybox sh execs its last command: the init, the exec'd sleep and the background one.
            await wait_until(lambda: len(box.pids()) == 3, "the exec and its background child")
            await srv.stop()  # serving() then checks that the exec, its children and its shim entry are gone
            await client.close()
    run(main)


def test_exec_in_a_stopped_or_unknown_container(box, targets):
    async def main():
        targets.add(box, running=False)
        async with serving(targets, (box,)) as srv:
            with pytest.raises(Exception) as exc:
                await spdy_exec(srv.get_exec_url(ExecRequest(box.cid, ("true",), stdout=True)))
            assert exc.value.reply.status == 409 and b"is not running" in exc.value.reply.body
            with pytest.raises(Exception) as exc:
                await spdy_exec(srv.get_exec_url(ExecRequest("hstrm-no-such-container", ("true",), stdout=True)))
            assert exc.value.reply.status == 404
        await assert_no_leaks(box)
    run(main)


def test_exec_fails_cleanly_when_the_shim_refuses(box, targets):
    """A command the runtime cannot start: an InternalError Status on the error stream, nothing left over."""
    async def main():
        async with serving(targets, (box,)) as srv:
            res = await spdy_exec(srv.get_exec_url(ExecRequest(box.cid, ("/no/such/binary",), stdout=True)))
            st = _status(res.error)
            # As with containerd: the runtime's start failure as an InternalError (kubectl prints it).
            assert st["status"] == "Failure" and st["reason"] == "InternalError"
            assert "/no/such/binary" in st["message"] and "no such file" in st["message"].lower()
    run(main)


def test_bad_requests_start_nothing(box, targets):
    """Expired, reused and unknown tokens, and subprotocols nobody speaks: clean HTTP errors, and no
    exec ever reaches the shim."""
    async def main():
        async with serving(targets, (box,), token_ttl=0.0) as srv:
            reply, client = await spdy_connect(srv.get_exec_url(ExecRequest(box.cid, ("true",), stdout=True)),
                                               ["v4.channel.k8s.io"])
            assert client is None and reply.status == 404  # expired at once (TTL 0)
        async with serving(targets, (box,)) as srv:
            url = srv.get_exec_url(ExecRequest(box.cid, ("sleep", "100000"), stdout=True))
            reply, client = await spdy_connect(url, ["v9.channel.k8s.io"])
            assert client is None and reply.status == 403
            assert "v4.channel.k8s.io" in reply.headers["x-accepted-stream-protocol-versions"]
            reply, client = await spdy_connect(url, ["v4.channel.k8s.io"])
            assert client is None and reply.status == 404  # the token was used by the refused attempt
            with pytest.raises(Exception) as exc:
                await ws_open(srv.get_exec_url(ExecRequest(box.cid, ("sleep", "100000"), stdout=True)),
                              ["v9.channel.k8s.io"])
            assert getattr(exc.value, "response", None) is not None and exc.value.response.status_code == 403
            reply, client = await spdy_connect(srv.base_url + "/exec/AAAAAAAAAAA", ["v4.channel.k8s.io"])
            assert client is None and reply.status == 404
        assert box.pids() == [box.init_pid] and not box.leftover_execs()
    run(main)


@pytest.mark.parametrize("transport", ["spdy", "ws"])
def test_exec_tty_starts_with_the_client_terminal_size(box, targets, transport):
    """The client's first size becomes the exec's consoleSize: the very first `stty size` sees it (no race
    between the process starting and a later ResizePty)."""
    async def main():
        # A generous wait for the first size makes the test independent of the machine's load.
        async with serving(targets, (box,), first_size_wait=60.0) as srv:
            url = srv.get_exec_url(ExecRequest(box.cid, ("stty", "size"), tty=True, stdout=True))
            if transport == "spdy":
                res = await spdy_exec(url, tty=True, resizes=((123, 45),))
            else:
                res = await ws_exec(url, resizes=((123, 45),))
            assert res.stdout == b"45 123\r\n"
    run(main)
