"""Port-forward into a real network namespace: busybox httpd listens on 127.0.0.1 inside a test netns;
the backend dials it with cri_server.streaming.netns, clients come over SPDY and WebSocket."""
from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import subprocess
import uuid

import pytest

from cri_server.streaming import PortForwardRequest
from cri_server.streaming.netns import open_connection_in_netns
from tests.streaming_support.backends import HostBackend
from tests.streaming_support.harness import run, serving
from tests.streaming_support.spdy_client import spdy_connect
from tests.streaming_support.ws_client import ws_port_forward
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.root

BUSYBOX = shutil.which("busybox") or "/usr/bin/busybox"


def _host_free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def pod(tmp_path):
    """A network namespace with lo up and busybox httpd on 127.0.0.1:<port> inside; all removed after."""
    name = f"husk-strm-{uuid.uuid4().hex[:8]}"
    www = tmp_path / "www"
    www.mkdir()
    body = f"hello from the pod {secrets.token_hex(4)}\n"
    (www / "index.html").write_text(body)
    port = _host_free_port()  # free on the host, so reaching httpd proves the dial happened in the netns
    subprocess.run(["ip", "netns", "add", name], check=True)
    httpd = None
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        httpd = subprocess.Popen(["ip", "netns", "exec", name, BUSYBOX, "httpd", "-f", "-p", f"127.0.0.1:{port}",
                                  "-h", str(www)])
        yield f"/var/run/netns/{name}", port, body
    finally:
        if httpd is not None:
            httpd.kill()
            httpd.wait()
        subprocess.run(["ip", "netns", "del", name], check=False)


async def _wait_listening(netns: str, port: int) -> None:
    async def listening() -> bool:
        try:
            _, w = await open_connection_in_netns(netns, port)
        except ConnectionRefusedError:
            return False
        w.close()
        return True
    await wait_for_async(listening, 10, f"httpd to listen on port {port} in {netns}", interval=0.01)


def _backend(netns: str) -> HostBackend:
    return HostBackend(dial=lambda sandbox_id, port: open_connection_in_netns(netns, port))


def test_dial_happens_inside_the_namespace(pod):
    netns, port, body = pod

    async def main():
        mine = os.stat("/proc/thread-self/ns/net").st_ino
        await _wait_listening(netns, port)
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)  # nothing on the host's loopback
        with pytest.raises(FileNotFoundError):
            await open_connection_in_netns("/var/run/netns/husk-strm-does-not-exist", port)
        # The event loop's thread never entered the pod's namespace.
        assert os.stat("/proc/thread-self/ns/net").st_ino == mine
        assert os.stat(netns).st_ino != mine
    run(main)


def test_port_forward_spdy_to_busybox_httpd(pod):
    netns, port, body = pod

    async def main():
        await _wait_listening(netns, port)
        async with serving(_backend(netns)) as (srv, be):
            _, client = await spdy_connect(srv.get_port_forward_url(PortForwardRequest("s1")), ["portforward.k8s.io"])
            for i in range(3):
                err = await client.open_stream({"streamType": "error", "port": str(port), "requestID": str(i)})
                await err.close()
                data = await client.open_stream({"streamType": "data", "port": str(port), "requestID": str(i)})
                await data.send(b"GET /index.html HTTP/1.0\r\nHost: pod\r\n\r\n")
                answer = await data.read_all()
                assert answer.startswith(b"HTTP/1.") and b" 200 " in answer.split(b"\r\n", 1)[0]
                assert answer.endswith(body.encode())
                assert await err.read_all() == b""
                await data.reset()
            await client.close()
    run(main)


def test_port_forward_websocket_to_busybox_httpd(pod):
    netns, port, body = pod

    async def main():
        await _wait_listening(netns, port)
        async with serving(_backend(netns)) as (srv, be):
            got, ports = await ws_port_forward(srv.get_port_forward_url(PortForwardRequest("s1", (port,))),
                                               "v4.channel.k8s.io", b"GET / HTTP/1.0\r\n\r\n")
            assert ports == [port]
            assert got[0].endswith(body.encode()) and got.get(1, b"") == b""
    run(main)


def test_port_forward_refused_inside_namespace(pod):
    netns, port, body = pod

    async def main():
        async with serving(_backend(netns)) as (srv, be):
            _, client = await spdy_connect(srv.get_port_forward_url(PortForwardRequest("s1")), ["portforward.k8s.io"])
            other = port + 1 if port < 65535 else port - 1
            err = await client.open_stream({"streamType": "error", "port": str(other), "requestID": "0"})
            await err.close()
            await client.open_stream({"streamType": "data", "port": str(other), "requestID": "0"})
            assert (await err.read_all()).startswith(f"error forwarding port {other} to pod s1".encode())
            await client.close()
    run(main)
