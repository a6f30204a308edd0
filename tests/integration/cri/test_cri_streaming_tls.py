"""husk-cri's streaming server with TLS from its config file: Exec/Attach/PortForward hand out https:// URLs, an
exec runs over TLS (SPDY and WebSocket), and a missing key file stops husk-cri at start with the key and file named."""
from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator

import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX, SANDBOX_IMAGE
from tests.integration.cri.helpers import container_config, nothing_left, pod_config, run_pod, start_container
from tests.streaming_support.spdy_client import spdy_exec
from tests.streaming_support.ws_client import ws_exec
from tests.support.cri import CriDaemon, PodNetwork
from tests.support.tlscerts import CertFiles, client_context, make_certs

pytestmark = [pytest.mark.root, pytest.mark.e2e]


def _tls_config(cert: str, key: str) -> str:
    return "\n".join(["[streaming]", f'tls_cert_file = "{cert}"', f'tls_key_file = "{key}"', ""])


@pytest.fixture
def tls_cri(tmp_path, pod_network: PodNetwork, registry_config_dir: str) -> Iterator[tuple[CriDaemon, CertFiles]]:
    certs = make_certs(str(tmp_path / "tls"))
    d = CriDaemon(str(tmp_path / "cri"), pod_network, registry_config_dir, SANDBOX_IMAGE,
                  extra_config=_tls_config(certs.server_cert, certs.server_key))
    try:
        d.start()
        yield d, certs
    finally:
        d.cleanup()


def test_exec_over_tls(tls_cri):
    cri, certs = tls_cri
    rt = cri.runtime_stub()
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    pod = pod_config(cri, "tls")
    pod_id = run_pod(rt, pod)
    cid = start_container(rt, pod_id, pod, container_config("c", ["sleep", "3600"]))
    ctx = client_context(certs)

    url = rt.Exec(pb.ExecRequest(container_id=cid, cmd=["sh", "-c", "cat; echo over-tls; exit 5"],
                                 stdin=True, stdout=True, stderr=True)).url
    assert url.startswith("https://127.0.0.1:")
    r = asyncio.run(spdy_exec(url, stdin=b"secret\n", stdout=True, stderr=True, ssl=ctx))
    assert r.stdout == b"secret\nover-tls\n" and b"NonZeroExitCode" in r.error and b"5" in r.error
    url = rt.Exec(pb.ExecRequest(container_id=cid, cmd=["echo", "websocket"], stdout=True)).url
    assert (asyncio.run(ws_exec(url, ssl=ctx))).stdout == b"websocket\n"
    # A client that does not trust the server's CA is refused in the handshake.
    url = rt.Exec(pb.ExecRequest(container_id=cid, cmd=["echo", "never"], stdout=True)).url
    with pytest.raises(OSError):
        asyncio.run(spdy_exec(url, ssl=ssl.create_default_context()))
    assert rt.Attach(pb.AttachRequest(container_id=cid, stdout=True)).url.startswith("https://127.0.0.1:")
    assert rt.PortForward(pb.PortForwardRequest(pod_sandbox_id=pod_id, port=[80])).url.startswith("https://")

    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    nothing_left(cri)


def test_missing_key_file_stops_the_start(tmp_path, pod_network: PodNetwork, registry_config_dir: str):
    certs = make_certs(str(tmp_path / "tls"))
    missing = str(tmp_path / "tls" / "no-such.key")
    d = CriDaemon(str(tmp_path / "cri"), pod_network, registry_config_dir, SANDBOX_IMAGE,
                  extra_config=_tls_config(certs.server_cert, missing))
    try:
        with pytest.raises(RuntimeError) as e:
            d.start()
        assert d.proc is not None and d.proc.returncode == 1
        assert f"streaming.tls_key_file: {missing}: cannot read" in str(e.value)
        assert "Traceback" not in d.log()
    finally:
        d.cleanup()
