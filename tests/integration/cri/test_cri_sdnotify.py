"""husk-cri under a Type=notify systemd unit, without systemd: a datagram socket stands in for $NOTIFY_SOCKET.
READY=1 comes once the CRI socket answers, STOPPING=1 on SIGTERM, and the runtimes husk-cri's shims run do not
inherit NOTIFY_SOCKET (runc given it waits in `start` for the container's own READY=1: pods would hang). Root."""
from __future__ import annotations

import socket

import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX, SANDBOX_IMAGE
from tests.integration.cri.helpers import container_config, pod_config, start_container, status
from tests.support.cri import CriDaemon

pytestmark = [pytest.mark.root, pytest.mark.e2e]


def test_ready_stopping_and_no_socket_for_runc(tmp_path, pod_network, registry_config_dir, monkeypatch):
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(path)
        listener.settimeout(60)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        d = CriDaemon(str(tmp_path / "d"), pod_network, registry_config_dir, SANDBOX_IMAGE)
        try:
            d.start()                                   # returns once the CRI socket answers
            assert listener.recv(4096) == b"READY=1"
            rt = d.runtime_stub()
            d.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
            pod = pod_config(d)
            pod_id = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod, runtime_handler="runc"),
                                      timeout=60).pod_sandbox_id
            cid = start_container(rt, pod_id, pod, container_config("c", ["sleep", "60"]))
            assert status(rt, cid).state == pb.CONTAINER_RUNNING
            d.remove_all_pods()
            d.stop()
            assert listener.recv(4096) == b"STOPPING=1"
        finally:
            d.cleanup()
