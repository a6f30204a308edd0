"""PortForward through a real husk-cri: a pod runs busybox httpd on 127.0.0.1 of its own network namespace; the
URL from PortForward leads to it over SPDY (`portforward.k8s.io`, as kubectl and crictl) and WebSocket
(`v4.channel.k8s.io`); a port nobody listens on is an error on the error stream."""
from __future__ import annotations

import asyncio
import secrets

import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX
from tests.integration.cri.helpers import (container_config, exec_sync, nothing_left, pod_config, run_pod,
                                           start_container, wait_for)
from tests.streaming_support.spdy_client import spdy_connect
from tests.streaming_support.ws_client import ws_port_forward

pytestmark = [pytest.mark.root, pytest.mark.e2e]

PORT = 8080


async def _spdy_get(url: str, port: int, path: str) -> tuple[bytes, bytes]:
    """One forwarded connection: (the HTTP answer, the error stream)."""
    reply, client = await spdy_connect(url, ["portforward.k8s.io"])
    assert client is not None, reply
    try:
        err = await client.open_stream({"streamType": "error", "port": str(port), "requestID": "0"})
        await err.close()
        data = await client.open_stream({"streamType": "data", "port": str(port), "requestID": "0"})
        await data.send(f"GET {path} HTTP/1.0\r\nHost: pod\r\n\r\n".encode())
        answer = await data.read_all()
        return answer, await err.read_all()
    finally:
        await client.close()


def test_port_forward_to_httpd_in_the_pod(cri):
    rt = cri.runtime_stub()
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    pod = pod_config(cri, "pf")
    pod_id = run_pod(rt, pod)
    body = f"served from the pod {secrets.token_hex(4)}"
    # Only on the pod's loopback: an answer proves the dial happened inside its network namespace.
    cid = start_container(rt, pod_id, pod, container_config("web", [
        "sh", "-c", f"mkdir -p /www && echo '{body}' > /www/index.html && exec httpd -f -p 127.0.0.1:{PORT} -h /www"]))
    wait_for(lambda: exec_sync(rt, cid, ["wget", "-q", "-O", "-", f"http://127.0.0.1:{PORT}/index.html"])
             .exit_code == 0, what="httpd listening")

    url = rt.PortForward(pb.PortForwardRequest(pod_sandbox_id=pod_id, port=[PORT])).url
    answer, err = asyncio.run(_spdy_get(url, PORT, "/index.html"))
    head, _, content = answer.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n", 1)[0] and content == f"{body}\n".encode() and err == b""

    url = rt.PortForward(pb.PortForwardRequest(pod_sandbox_id=pod_id, port=[PORT])).url
    got, ports = asyncio.run(ws_port_forward(url, "v4.channel.k8s.io", b"GET /index.html HTTP/1.0\r\n\r\n"))
    assert ports == [PORT] and got[0].endswith(f"\r\n\r\n{body}\n".encode()) and got.get(1, b"") == b""

    url = rt.PortForward(pb.PortForwardRequest(pod_sandbox_id=pod_id)).url
    _, err = asyncio.run(_spdy_get(url, PORT + 1, "/"))
    assert err.startswith(f"error forwarding port {PORT + 1} to pod {pod_id}".encode()), err

    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    nothing_left(cri)
