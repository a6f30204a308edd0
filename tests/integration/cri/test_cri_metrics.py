"""The CRI metrics RPCs and the stats kubelet reads with PodAndContainerStatsFromCRI, against a real husk-cri:
a pod whose container burns a bounded amount of CPU, traffic out of the pod's eth0, then ListMetricDescriptors,
ListPodSandboxMetrics and StreamPodSandboxMetrics over gRPC, and ListPodSandboxStats' completeness.
Root: real shims, CNI bridge in names of the test's own."""
from __future__ import annotations

import os

import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX
from tests.integration.cri.helpers import container_config, exec_sync, pod_config, run_pod, start_container, wait_for

pytestmark = [pytest.mark.root, pytest.mark.e2e]

# Busy until the shell itself has used 1.5 s of user CPU (utime, field 14 of /proc/$$/stat, in 1/100 s), so the
# amount does not depend on how loaded the machine is; then idle.
BURN = ("while :; do set -- $(cat /proc/$$/stat); [ ${14} -ge 150 ] && break; "
        "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; done; exec sleep 3600")


def _descriptors(rt) -> dict[str, list[str]]:
    return {d.name: list(d.label_keys) for d in rt.ListMetricDescriptors(pb.ListMetricDescriptorsRequest()).descriptors}


def _pod_metrics(rt, pod_id: str) -> pb.PodSandboxMetrics:
    (pm,) = [p for p in rt.ListPodSandboxMetrics(pb.ListPodSandboxMetricsRequest(), timeout=60).pod_metrics
             if p.pod_sandbox_id == pod_id]
    return pm


def _get(ms, descs, name: str, **labels: str) -> int | None:
    keys = descs[name]
    hits = [m.value.value for m in ms if m.name == name
            and all(m.label_values[keys.index(k)] == v for k, v in labels.items())]
    assert len(hits) <= 1, (name, labels)
    return hits[0] if hits else None


def _container_series(pm: pb.PodSandboxMetrics, cid: str) -> list[pb.Metric]:
    (cm,) = [c for c in pm.container_metrics if c.container_id == cid]
    return list(cm.metrics)


def test_metrics_of_a_running_pod(cri):
    rt = cri.runtime_stub()
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    pod = pod_config(cri, "metrics")
    pod_id = run_pod(rt, pod)
    cid = start_container(rt, pod_id, pod, container_config("burner", ["sh", "-c", BURN]))
    descs = _descriptors(rt)

    # CPU in whole seconds: at least 1 once the burn is done.
    pm = wait_for(lambda: (p := _pod_metrics(rt, pod_id)) and
                  (_get(_container_series(p, cid), descs, "container_cpu_usage_seconds_total", cpu="total") or 0) >= 1
                  and p, timeout=120, what="1 s of CPU in container_cpu_usage_seconds_total")
    for m in [*pm.metrics, *(x for c in pm.container_metrics for x in c.metrics)]:
        assert m.name in descs, m.name
        assert len(m.label_values) == len(descs[m.name]), m.name
    cs = _container_series(pm, cid)
    assert cs[0].label_values[:5] == [cid, BUSYBOX, "hct", "metrics", "burner"]
    assert _get(cs, descs, "container_memory_working_set_bytes") > 0
    assert _get(cs, descs, "container_memory_usage_bytes") > 0
    assert _get(cs, descs, "container_processes") >= 1
    assert _get(cs, descs, "container_threads") >= 1
    assert _get(cs, descs, "container_file_descriptors") >= 1
    assert _get(cs, descs, "container_start_time_seconds") > 0
    assert _get(cs, descs, "container_fs_usage_bytes") is not None

    # Network is per pod, one series per interface of the pod's namespace (lo left out).
    assert {m.label_values[4] for m in pm.metrics} == {"POD"}
    assert {m.label_values[5] for m in pm.metrics} == {"eth0"}
    before_tx = _get(pm.metrics, descs, "container_network_transmit_bytes_total", interface="eth0")
    before_rx = _get(pm.metrics, descs, "container_network_receive_bytes_total", interface="eth0")
    gateway = cri.network.subnet_prefix + ".1"
    exec_sync(rt, cid, ["sh", "-c", f"ping -c 3 -W 1 {gateway}; wget -q -T 2 -O /dev/null http://{gateway}:9/; true"])
    pm = wait_for(lambda: (p := _pod_metrics(rt, pod_id)) and
                  _get(p.metrics, descs, "container_network_transmit_bytes_total", interface="eth0") > before_tx and
                  _get(p.metrics, descs, "container_network_receive_bytes_total", interface="eth0") > before_rx and p,
                  what="eth0 counters to rise after traffic to the gateway")
    assert _get(pm.metrics, descs, "container_network_transmit_packets_total", interface="eth0") > 0

    # The stream sends the same series.
    streamed = [p for r in rt.StreamPodSandboxMetrics(pb.StreamPodSandboxMetricsRequest(), timeout=60)
                for p in r.pod_sandbox_metrics]
    (sp,) = [p for p in streamed if p.pod_sandbox_id == pod_id]
    pm = _pod_metrics(rt, pod_id)
    assert sorted((m.name, tuple(m.label_values)) for m in sp.metrics) == \
        sorted((m.name, tuple(m.label_values)) for m in pm.metrics)
    assert [c.container_id for c in sp.container_metrics] == [cid]
    assert {m.name for m in sp.container_metrics[0].metrics} == {m.name for m in _container_series(pm, cid)}


def test_pod_stats_have_what_kubelet_reads_from_cri(cri):
    """PodAndContainerStatsFromCRI: kubelet takes the pod's cpu, memory, network, process count and each
    container's cpu, memory, swap and writable layer from ListPodSandboxStats alone."""
    rt = cri.runtime_stub()
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    pod = pod_config(cri, "summary")
    pod_id = run_pod(rt, pod)
    cfg = container_config("main", ["sh", "-c", "echo x > /written; exec sleep 3600"])
    cfg.linux.resources.memory_limit_in_bytes = 64 << 20
    cid = start_container(rt, pod_id, pod, cfg)
    wait_for(lambda: exec_sync(rt, cid, ["cat", "/written"]).stdout == b"x\n", what="the container's write")
    (st,) = [s for s in rt.ListPodSandboxStats(pb.ListPodSandboxStatsRequest(), timeout=60).stats
             if s.attributes.id == pod_id]
    lx = st.linux
    assert lx.process.process_count.value >= 2
    assert lx.memory.rss_bytes.value > 0 and lx.memory.page_faults.value > 0
    assert 0 < lx.memory.available_bytes.value <= 64 << 20           # its one container has a limit
    assert lx.network.default_interface.name == "eth0"
    assert [i.name for i in lx.network.interfaces] == ["eth0"]
    (c,) = lx.containers
    assert c.memory.available_bytes.value > 0 and c.memory.rss_bytes.value > 0
    assert c.memory.page_faults.value > 0
    assert c.writable_layer.fs_id.mountpoint and c.writable_layer.used_bytes.value > 0
    assert c.writable_layer.inodes_used.value >= 1
    if os.path.exists("/sys/fs/cgroup/memory/memory.memsw.usage_in_bytes"):   # v1 with swap accounting
        assert c.swap.timestamp > 0 and c.swap.HasField("swap_usage_bytes")
