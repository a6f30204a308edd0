"""Bad requests get clean HTTP errors and start nothing: unknown/expired/reused tokens, unknown
containers, wrong subprotocols, missing upgrade headers, bad methods and paths; and TLS."""
from __future__ import annotations

import asyncio
import ssl
import subprocess

import pytest

from cri_server.streaming import AttachRequest, ExecRequest, PortForwardRequest, StreamingServer, TooManyRequests
from tests.streaming_support.harness import run, serving
from tests.streaming_support.spdy_client import http_request, spdy_connect, spdy_exec

UPGRADE = [("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"), ("X-Stream-Protocol-Version", "v4.channel.k8s.io")]
EXEC = ExecRequest("c1", ("echo", "hi"), stdout=True)


async def _status(url: str, headers=UPGRADE, method: str = "POST"):
    reply, _, writer = await http_request(url, method, headers)
    writer.close()
    return reply


def test_urls_and_single_use_tokens():
    async def main():
        async with serving() as (srv, be):
            url = srv.get_exec_url(EXEC)
            assert url.startswith(f"http://127.0.0.1:{srv.port}/exec/") and len(url.rsplit("/", 1)[1]) == 11
            assert srv.get_attach_url(AttachRequest("c1", stdout=True)).split("/")[3] == "attach"
            assert srv.get_port_forward_url(PortForwardRequest("s1")).split("/")[3] == "portforward"
            assert (await spdy_exec(url)).stdout == b"hi\n"
            reply = await _status(url)  # reused
            assert (reply.status, reply.body) == (404, b"404 page not found\n")
            assert len(be.procs) == 1
    run(main)


def test_expired_token():
    async def main():
        async with serving(token_ttl=0.0) as (srv, be):
            reply = await _status(srv.get_exec_url(EXEC))
            assert reply.status == 404 and be.procs == []
    run(main)


def test_unknown_token_wrong_kind_path_and_method():
    async def main():
        async with serving() as (srv, be):
            base = srv.base_url
            assert (await _status(f"{base}/exec/AAAAAAAAAAA")).status == 404
            token = srv.get_exec_url(EXEC).rsplit("/", 1)[1]
            assert (await _status(f"{base}/attach/{token}")).status == 404  # exec token on attach
            assert (await _status(f"{base}/exec/{token}")).status == 404  # ...and it was consumed
            assert (await _status(f"{base}/exec")).status == 404
            assert (await _status(f"{base}/other/{token}")).status == 404
            assert (await _status(srv.get_exec_url(EXEC), method="PUT")).status == 405
            assert be.procs == []
    run(main)


def test_unknown_container_and_sandbox_are_404_before_upgrade():
    async def main():
        async with serving() as (srv, be):
            reply = await _status(srv.get_exec_url(ExecRequest("nope", ("true",), stdout=True)))
            assert reply.status == 404 and b"container 'nope' not found" in reply.body
            reply = await _status(srv.get_port_forward_url(PortForwardRequest("nosb")),
                                  headers=[("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1")])
            assert reply.status == 404 and b"sandbox 'nosb' not found" in reply.body
            assert be.procs == [] and be.forward_targets == []
    run(main)


def test_wrong_subprotocol_is_403_with_accepted_versions():
    async def main():
        async with serving() as (srv, be):
            reply, client = await spdy_connect(srv.get_exec_url(EXEC), ["v9.channel.k8s.io", "bogus"])
            assert client is None and reply.status == 403
            assert reply.headers["x-accepted-stream-protocol-versions"] == [
                "v5.channel.k8s.io", "v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io"]
            assert reply.body.startswith(b"unable to upgrade: unable to negotiate protocol: client supports [v9")
            reply, client = await spdy_connect(srv.get_port_forward_url(PortForwardRequest("s1")),
                                               ["v4.channel.k8s.io"])
            assert reply.status == 403 and reply.headers["x-accepted-stream-protocol-versions"] == ["portforward.k8s.io"]
            assert be.procs == []
    run(main)


def test_missing_upgrade_headers_is_400():
    async def main():
        async with serving() as (srv, be):
            reply = await _status(srv.get_exec_url(EXEC), headers=[("X-Stream-Protocol-Version", "v4.channel.k8s.io")])
            assert reply.status == 400 and b"missing upgrade headers" in reply.body
            reply = await _status(srv.get_exec_url(EXEC), headers=[("Connection", "Upgrade"), ("Upgrade", "h2c")])
            assert reply.status == 400
            assert be.procs == []
    run(main)


def test_malformed_requests():
    async def main():
        async with serving(request_head_timeout=0.5) as (srv, be):
            for raw in (b"GARBAGE\r\n\r\n", b"GET /exec/x HTTP/1.1\r\nbad header\r\n\r\n",
                        b"GET exec/y HTTP/1.1\r\n\r\n", b"GET /exec/x HTTP/2.0\r\n\r\n"):
                r, w = await asyncio.open_connection("127.0.0.1", srv.port)
                w.write(raw)
                assert (await r.read()).startswith(b"HTTP/1.1 400 Bad Request\r\n")
                w.close()
            r, w = await asyncio.open_connection("127.0.0.1", srv.port)  # absolute form, unknown token
            w.write(b"GET http://127.0.0.1/exec/AAAAAAAAAAA HTTP/1.1\r\n\r\n")
            assert (await r.read()).startswith(b"HTTP/1.1 404 Not Found\r\n")
            w.close()
            r, w = await asyncio.open_connection("127.0.0.1", srv.port)
            w.write(b"GET /exec/x HTTP/1.1\r\n" + b"X-Big: " + b"a" * 70000 + b"\r\n\r\n")
            assert (await r.read()).startswith(b"HTTP/1.1 431 ")
            w.close()
            r, w = await asyncio.open_connection("127.0.0.1", srv.port)  # never sends a request
            assert (await r.read()).startswith(b"HTTP/1.1 408 ")
            w.close()
            r, w = await asyncio.open_connection("127.0.0.1", srv.port)  # connects and leaves
            w.close()
    run(main)


def test_websocket_bad_version_is_426():
    async def main():
        async with serving() as (srv, be):
            reply = await _status(srv.get_exec_url(EXEC), method="GET", headers=[
                ("Connection", "Upgrade"), ("Upgrade", "websocket"), ("Sec-WebSocket-Version", "8"),
                ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")])
            assert reply.status == 426 and reply.first("sec-websocket-version") == "13"
    run(main)


def test_in_flight_limit():
    async def main():
        async with serving(max_in_flight=3) as (srv, be):
            for _ in range(3):
                srv.get_exec_url(EXEC)
            with pytest.raises(TooManyRequests):
                srv.get_exec_url(EXEC)
            assert srv.pending_tokens == 3
    run(main)


def test_url_before_start_and_ipv6_and_base_url():
    async def main():
        from tests.streaming_support.backends import HostBackend
        srv = StreamingServer("127.0.0.1:0", HostBackend())
        with pytest.raises(RuntimeError):
            srv.get_exec_url(EXEC)
        try:
            v6 = StreamingServer("[::1]:0", HostBackend())
            await v6.start()
        except OSError:
            pytest.skip("no IPv6 loopback")
        try:
            assert v6.get_exec_url(EXEC).startswith(f"http://[::1]:{v6.port}/exec/")
            assert (await spdy_exec(v6.get_exec_url(EXEC))).stdout == b"hi\n"
        finally:
            await v6.stop()
    run(main)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


def test_tls_spdy_and_websocket(tls_files):
    from tests.streaming_support.ws_client import ws_exec
    cert, key = tls_files

    async def main():
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(cert, key)
        client_ctx = ssl.create_default_context(cafile=str(cert))
        async with serving(tls=server_ctx) as (srv, be):
            url = srv.get_exec_url(ExecRequest("c1", ("sh", "-c", "cat; exit 3"), stdin=True, stdout=True))
            assert url.startswith("https://127.0.0.1:")
            res = await spdy_exec(url, stdin=b"secret", ssl=client_ctx)
            assert res.stdout == b"secret" and b'"message":"3"' in res.error
            url = srv.get_exec_url(ExecRequest("c1", ("echo", "tls"), stdout=True))
            assert (await ws_exec(url, ssl=client_ctx)).stdout == b"tls\n"
    run(main)


def test_backend_check_failure_is_500():
    async def main():
        async with serving() as (srv, be):
            async def broken(request):
                raise RuntimeError("store unavailable")
            be.check = broken  # type: ignore[method-assign]
            reply = await _status(srv.get_exec_url(EXEC))
            assert reply.status == 500 and b"store unavailable" in reply.body
    run(main)


def test_options_come_from_the_cached_request_not_the_query():
    async def main():
        async with serving() as (srv, be):
            url = srv.get_exec_url(ExecRequest("c1", ("sh", "-c", "tty || echo no-tty"), stdout=True))
            res = await spdy_exec(url + "?tty=1&stdin=1&stderr=1&command=evil")
            assert res.stdout.endswith(b"no-tty\n")
            assert [p.returncode for p in be.procs] == [0] and be.resizes == []
    run(main)
