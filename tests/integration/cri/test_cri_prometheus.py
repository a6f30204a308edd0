"""husk-cri's /metrics against a real daemon started with `[metrics] address`: pulls, a pod and a container, a
failing RPC, then a scrape over HTTP parsed with prometheus_client's parser; the pod's teardown and SIGTERM
after. Without the key, husk-cri never imports prometheus_client (an audit hook loaded through sitecustomize
reports the import; the metrics daemon is its positive control). Root: real shims and a CNI bridge."""
from __future__ import annotations

import os
import socket
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX, SANDBOX_IMAGE
from tests.integration.cri.helpers import container_config, pod_config, run_pod, start_container, wait_for
from tests.support.cri import CriDaemon, PodNetwork, free_port

pytestmark = pytest.mark.root

AUDIT = """import os, sys
def _hook(event, args):
    if event == "import" and str(args[0]).split(".")[0] == "prometheus_client":
        os.write(2, f"AUDIT {os.getpid()} import {args[0]}\\n".encode())
sys.addaudithook(_hook)
"""

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _daemon(base: str, network: PodNetwork, registry_config_dir: str, monkeypatch: Any,
            metrics_address: str = "") -> CriDaemon:
    site = os.path.join(base, "site")
    os.makedirs(site)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(AUDIT)
    monkeypatch.setenv("PYTHONPATH", site)
    extra = f'[metrics]\naddress = "{metrics_address}"\n' if metrics_address else ""
    return CriDaemon(os.path.join(base, "cri"), network, registry_config_dir, SANDBOX_IMAGE, extra_config=extra,
                     log_level="info")


@pytest.fixture
def metrics_cri(tmp_path, pod_network: PodNetwork, registry_config_dir: str, monkeypatch) -> Iterator[CriDaemon]:
    d = _daemon(str(tmp_path), pod_network, registry_config_dir, monkeypatch, f"127.0.0.1:{free_port()}")
    try:
        d.start()
        yield d
    finally:
        d.cleanup()


def _url(cri: CriDaemon) -> str:
    with open(cri.config_path) as f:
        address = f.read().split('[metrics]\naddress = "', 1)[1].split('"', 1)[0]
    return f"http://{address}/metrics"


def scrape(cri: CriDaemon) -> Samples:
    with urllib.request.urlopen(_url(cri), timeout=30) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def test_scrape_after_a_pod_a_container_and_a_failing_rpc(metrics_cri: CriDaemon) -> None:
    cri = metrics_cri
    rt = cri.runtime_stub()
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    pod = pod_config(cri, "prom")
    pod_id = run_pod(rt, pod)                                   # pulls the sandbox image on demand
    cid = start_container(rt, pod_id, pod, container_config("sleeper", ["sleep", "3600"]))
    for _ in range(3):
        rt.Version(pb.VersionRequest())
    with pytest.raises(grpc.RpcError) as err:
        rt.ContainerStatus(pb.ContainerStatusRequest(container_id="no-such-container"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND

    s = scrape(cri)
    count = "husk_cri_rpc_duration_seconds_count"
    assert total(s, count, method="Version") == 3
    for method in ("PullImage", "RunPodSandbox", "CreateContainer", "StartContainer", "ContainerStatus"):
        assert total(s, count, method=method) == 1, method
    assert total(s, "husk_cri_rpc_errors_total", method="ContainerStatus", code="NOT_FOUND") == 1
    assert total(s, "husk_cri_rpc_errors_total", method="RunPodSandbox") == 0
    assert total(s, "husk_cri_pods", state="ready") == 1
    assert total(s, "husk_cri_containers", state="running") == 1
    assert total(s, "husk_cri_shims") == 1                       # the pod's: its sandbox's and container's
    assert total(s, "husk_cri_shims_pss_bytes") > 0
    assert total(s, "husk_cri_image_pulls_total", result="success") == 2     # busybox, then the pause image
    assert total(s, "husk_cri_image_pull_duration_seconds_count") == 2
    assert total(s, "husk_cri_image_pull_bytes_total") > 0
    assert total(s, "husk_cri_cni_plugin_duration_seconds_count", op="ADD", plugin="bridge") == 1
    assert total(s, "husk_cri_cni_plugin_errors_total") == 0
    assert total(s, "husk_cri_startup_step_duration_seconds_count", kind="container") > 0
    assert total(s, "process_resident_memory_bytes") > 0

    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    s = wait_for(lambda: (x := scrape(cri)) and total(x, "husk_cri_shims") == 0 and x, 30, "the shims to end")
    assert total(s, "husk_cri_pods", state="notready") == 1
    assert total(s, "husk_cri_containers", state="exited") == 1
    assert total(s, "husk_cri_cni_plugin_duration_seconds_count", op="DEL") >= 1
    assert cid

    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    assert f"AUDIT {cri.proc.pid} import prometheus_client" in cri.log()    # the audit hook works
    cri.stop()
    assert cri.proc.returncode == 0
    host, port = _url(cri).split("/")[2].split(":")
    with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
        sock.connect((host, int(port)))


def test_without_the_key_prometheus_client_is_never_imported(tmp_path, pod_network: PodNetwork,
                                                              registry_config_dir: str, monkeypatch) -> None:
    cri = _daemon(str(tmp_path), pod_network, registry_config_dir, monkeypatch)
    try:
        cri.start()
        rt = cri.runtime_stub()
        rt.Version(pb.VersionRequest())
        rt.ListPodSandbox(pb.ListPodSandboxRequest())
        with pytest.raises(grpc.RpcError):
            rt.ContainerStatus(pb.ContainerStatusRequest(container_id="no-such-container"))
        cri.stop()
        assert cri.proc.returncode == 0
        assert "husk-cri serving" in cri.log()
        assert "AUDIT" not in cri.log()
    finally:
        cri.cleanup()
