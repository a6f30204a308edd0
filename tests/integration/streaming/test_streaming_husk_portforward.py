"""Port-forward through HuskStreamBackend: a busybox httpd container listens on 127.0.0.1 inside a network
namespace the test makes (the pod's); clients forward to it over SPDY and WebSocket."""
from __future__ import annotations

import asyncio
import secrets
import socket
import subprocess
import uuid

import pytest

from cri_server.streaming import PortForwardRequest
from cri_server.streaming.netns import open_connection_in_netns
from tests.shim_fixtures import runtimes_available
from tests.streaming_support.harness import run
from tests.streaming_support.shim_pods import Targets, serving, start_container, stop_container
from tests.streaming_support.spdy_client import spdy_connect
from tests.streaming_support.ws_client import ws_port_forward
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.root


def _host_free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(params=runtimes_available())
def pod(request, tmp_path):
    """A netns with lo up and an httpd container in it; yields (sandbox netns path, port, body, container)."""
    name = f"hstrm-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    box = None
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        port = _host_free_port()  # free on the host: an answer proves the dial happened in the pod's netns
        body = f"hello from the pod {secrets.token_hex(4)}\n"
        netns = f"/var/run/netns/{name}"
        box = start_container(str(tmp_path), ["sh", "-c", f"mkdir -p /www && echo '{body.strip()}' > /www/index.html "
                                                           f"&& exec httpd -f -p 127.0.0.1:{port} -h /www"],
                              netns=netns, runtime=request.param)
        yield netns, port, body, box
    finally:
        if box is not None:
            stop_container(box)
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


def test_port_forward_spdy_and_websocket_into_the_pod(pod):
    netns, port, body, box = pod
    targets = Targets(netns={"sb1": netns})

    async def main():
        await _wait_listening(netns, port)
        async with serving(targets) as srv:
            _, client = await spdy_connect(srv.get_port_forward_url(PortForwardRequest("sb1")), ["portforward.k8s.io"])
            for i in range(3):
                err = await client.open_stream({"streamType": "error", "port": str(port), "requestID": str(i)})
                await err.close()
                data = await client.open_stream({"streamType": "data", "port": str(port), "requestID": str(i)})
                await data.send(b"GET /index.html HTTP/1.0\r\nHost: pod\r\n\r\n")
                answer = await data.read_all()
                assert b" 200 " in answer.split(b"\r\n", 1)[0] and answer.endswith(body.encode())
                assert await err.read_all() == b""
                await data.reset()
            # Nothing listens on the next port in the pod: the error stream says so.
            other = port + 1 if port < 65535 else port - 1
            err = await client.open_stream({"streamType": "error", "port": str(other), "requestID": "9"})
            await err.close()
            await client.open_stream({"streamType": "data", "port": str(other), "requestID": "9"})
            assert (await err.read_all()).startswith(f"error forwarding port {other} to pod sb1".encode())
            await client.close()

            got, ports = await ws_port_forward(srv.get_port_forward_url(PortForwardRequest("sb1", (port,))),
                                               "v4.channel.k8s.io", b"GET / HTTP/1.0\r\n\r\n")
            assert ports == [port] and got[0].endswith(body.encode()) and got.get(1, b"") == b""
    run(main)


def test_port_forward_host_network_pod_and_unknown_sandbox():
    """A host-network pod ("" netns) forwards to the host's 127.0.0.1; an unknown sandbox is a 404."""
    targets = Targets(netns={"hostnet": ""})

    async def main():
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"host says " + await reader.readline())
            await writer.drain()
            writer.close()
        listener = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        try:
            async with serving(targets) as srv:
                got, ports = await ws_port_forward(srv.get_port_forward_url(PortForwardRequest("hostnet", (port,))),
                                                   "v4.channel.k8s.io", b"hi\n")
                assert got[0] == b"host says hi\n"
                reply, client = await spdy_connect(srv.get_port_forward_url(PortForwardRequest("nope")),
                                                   ["portforward.k8s.io"])
                assert client is None and reply.status == 404
        finally:
            listener.close()
            await listener.wait_closed()
    run(main)
