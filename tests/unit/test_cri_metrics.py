"""The CRI metrics RPCs and the stats built from the same samples, on a store with fake shims and a fake image
service (no root, no daemon): descriptor/label alignment, names, types, units, what is per pod and per
container, and that a missing shim or file leaves out only its part. Also the shim's cgroup readings that
feed them (memsw, v2 swap and peak, block I/O) from fake cgroup directories."""
from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
from types import SimpleNamespace

import pytest

from cri_server.api.v1 import api_pb2 as pb
from cri_server.config import Config
from cri_server.context import Services
from cri_server.network.cni import CniManager
from cri_server.oom import OomScorePolicy
from cri_server.rpc import metrics, stats
from cri_server.store.records import ContainerRecord, ContainerState, SandboxRecord, SandboxState
from cri_server.store.store import Store
from runtime.cgroups.v1 import V1Manager
from runtime.cgroups.v2 import V2Manager
from shim import cgroup_watch
from shim.pb import cgroups_v1 as cg
from tests.support.waiting import wait_for_async

GIB = 1 << 30
NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0
  eth0:    5000      40    1    2    0     0          0         0     3000      30    3    4    0     0       0          0
"""


def _cgroup_metrics(cpu_s: float = 2.5) -> cg.Metrics:
    return cg.Metrics(
        cpu=cg.CPUStat(usage=cg.CPUUsage(total=int(cpu_s * 1e9), user=int(1.9e9), kernel=int(0.6e9)),
                       throttling=cg.Throttle(periods=10, throttled_periods=3, throttled_time=int(4.2e9))),
        memory=cg.MemoryStat(total_cache=300, total_rss=500, total_mapped_file=70, total_inactive_file=200,
                             total_pg_fault=11, total_pg_maj_fault=2,
                             usage=cg.MemoryEntry(usage=1000, limit=GIB, max=1500, failcnt=1),
                             swap=cg.MemoryEntry(usage=1040, limit=GIB + 4096), kernel=cg.MemoryEntry(usage=64)),
        memory_oom_control=cg.MemoryOomControl(oom_kill=1),
        pids=cg.PidsStat(current=3, limit=100),
        blkio=cg.BlkIOStat(io_service_bytes_recursive=[cg.BlkIOEntry(op="Read", major=8, minor=0, value=4096),
                                                       cg.BlkIOEntry(op="Write", major=8, minor=0, value=8192),
                                                       cg.BlkIOEntry(op="Total", major=8, minor=0, value=12288)],
                           io_serviced_recursive=[cg.BlkIOEntry(op="Read", major=8, minor=0, value=1)]))


class FakeShims:
    def __init__(self, by_id: dict[str, cg.Metrics]) -> None:
        self.by_id = by_id

    async def call(self, object_id, address, method, timeout=None, **kw):
        from cri_server.shims import ShimGone
        assert method == "Stats"
        if object_id not in self.by_id:
            raise ShimGone(object_id)
        v = self.by_id[object_id]
        return SimpleNamespace(stats=SimpleNamespace(value=v if isinstance(v, bytes) else v.encode(),
                                                     type_url="io.containerd.cgroups.v1.Metrics"))


class FakeImages:
    snapshots = SimpleNamespace(active_dir="/var/lib/husk/images/snapshots/active")

    def usage(self, key):
        if key == "c-nolayer":
            raise FileNotFoundError(key)
        return SimpleNamespace(bytes=8192, inodes=5)


def _config(memory: int = 256 << 20, quota: int = 50000) -> bytes:
    c = pb.ContainerConfig()
    r = c.linux.resources
    r.memory_limit_in_bytes, r.cpu_shares, r.cpu_period, r.cpu_quota = memory, 512, 100000, quota
    return c.SerializeToString()


@pytest.fixture
def svc(tmp_path, monkeypatch):
    store = Store(str(tmp_path / "meta.db"))
    s = Services(config=Config(), store=store, cni=CniManager(str(tmp_path), [], str(tmp_path)),
                 oom=OomScorePolicy(-1000))
    now = time.time_ns()
    store.put_sandbox(SandboxRecord(id="sb1", name="n1", pod_name="web", pod_uid="u1", pod_namespace="prod",
                                    attempt=0, state=SandboxState.READY, created_at=now, netns_path="/x/netns",
                                    pid=4242, shim_address="unix:///s/sb1"))
    store.put_sandbox(SandboxRecord(id="sb-down", name="n2", pod_name="old", pod_uid="u2", pod_namespace="prod",
                                    attempt=0, state=SandboxState.NOTREADY, created_at=now))
    for cid, state in (("c-run", ContainerState.RUNNING), ("c-gone", ContainerState.RUNNING),
                       ("c-exited", ContainerState.EXITED), ("c-nolayer", ContainerState.RUNNING)):
        store.put_container(ContainerRecord(id=cid, sandbox_id="sb1", name=cid, container_name=cid + "-name",
                                            attempt=0, state=state, created_at=1_700_000_000 * 10**9,
                                            image="docker.io/library/busybox:latest", image_ref="sha256:aa",
                                            shim_address=f"unix:///s/{cid}", pid=0, config=_config()))
    s.shims = FakeShims({"sb1": _cgroup_metrics(0.1), "c-run": _cgroup_metrics(), "c-nolayer": _cgroup_metrics()})
    s.images = FakeImages()
    real_open = open
    netdev = tmp_path / "net_dev"
    netdev.write_text(NET_DEV)
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real_open(netdev if p == "/proc/4242/net/dev"
                                                                       else p, *a, **k))
    yield s
    store.close()


def run(coro):
    return asyncio.run(coro)


def _descs(svc) -> dict[str, pb.MetricDescriptor]:
    return {d.name: d for d in run(metrics.list_metric_descriptors(svc, pb.ListMetricDescriptorsRequest()))
            .descriptors}


def _series(m: pb.PodSandboxMetrics) -> list[pb.Metric]:
    return [*m.metrics, *(x for c in m.container_metrics for x in c.metrics)]


def _value(ms, name, **labels) -> int:
    descs = metrics.DESCRIPTORS
    hits = [m.value.value for m in ms if m.name == name and
            all(m.label_values[list(descs[name].label_keys).index(k)] == v for k, v in labels.items())]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def test_descriptors_are_cadvisor_names_with_the_base_labels_first(svc):
    descs = _descs(svc)
    required = """container_cpu_usage_seconds_total container_cpu_user_seconds_total container_cpu_system_seconds_total
        container_cpu_cfs_periods_total container_cpu_cfs_throttled_periods_total
        container_cpu_cfs_throttled_seconds_total container_memory_usage_bytes container_memory_working_set_bytes
        container_memory_rss container_memory_cache container_memory_swap container_memory_failcnt
        container_memory_mapped_file container_memory_max_usage_bytes container_oom_events_total
        container_spec_memory_limit_bytes container_spec_cpu_period container_spec_cpu_quota
        container_spec_cpu_shares container_processes container_threads container_file_descriptors
        container_network_receive_bytes_total container_network_transmit_bytes_total
        container_network_receive_packets_total container_network_transmit_packets_total
        container_network_receive_errors_total container_network_transmit_errors_total
        container_network_receive_packets_dropped_total container_network_transmit_packets_dropped_total
        container_fs_usage_bytes container_fs_reads_bytes_total container_fs_writes_bytes_total container_last_seen
        container_start_time_seconds""".split()
    assert set(required) <= set(descs)
    for d in descs.values():
        assert d.name.startswith("container_") and d.help
        assert list(d.label_keys[:5]) == ["id", "image", "namespace", "pod", "container"]
        assert len(set(d.label_keys)) == len(d.label_keys)
    assert list(descs["container_cpu_usage_seconds_total"].label_keys[5:]) == ["cpu"]
    assert list(descs["container_network_receive_bytes_total"].label_keys[5:]) == ["interface"]
    assert list(descs["container_fs_reads_bytes_total"].label_keys[5:]) == ["device"]
    assert list(descs["container_memory_failures_total"].label_keys[5:]) == ["failure_type", "scope"]


def test_every_series_has_a_descriptor_and_aligned_labels(svc):
    descs = _descs(svc)
    (pod,) = run(metrics.list_pod_sandbox_metrics(svc, pb.ListPodSandboxMetricsRequest())).pod_metrics
    assert pod.pod_sandbox_id == "sb1"          # the NotReady pod has no series
    ms = _series(pod)
    assert ms
    for m in ms:
        assert m.name in descs, m.name
        assert len(m.label_values) == len(descs[m.name].label_keys), m.name
        assert m.timestamp > 0
        assert m.metric_type == (pb.COUNTER if m.name.endswith("_total") or m.name == "container_memory_failcnt"
                                 else pb.GAUGE), m.name
    # Series are unique by name and labels, as Prometheus needs.
    keys = [(m.name, tuple(m.label_values)) for m in ms]
    assert len(keys) == len(set(keys))


def test_values_units_and_labels(svc):
    (pod,) = run(metrics.list_pod_sandbox_metrics(svc, pb.ListPodSandboxMetricsRequest())).pod_metrics
    # Network is per pod: the pause's namespace, container "POD", one series per interface but lo.
    assert {m.name for m in pod.metrics} == {n for n in metrics.DESCRIPTORS if n.startswith("container_network_")}
    rx = [m for m in pod.metrics if m.name == "container_network_receive_bytes_total"]
    assert [list(m.label_values) for m in rx] == [["sb1", "", "prod", "web", "POD", "eth0"]]
    assert rx[0].value.value == 5000 and rx[0].metric_type == pb.COUNTER
    ms = list(pod.metrics)
    assert (_value(ms, "container_network_receive_packets_dropped_total"),
            _value(ms, "container_network_transmit_errors_total"),
            _value(ms, "container_network_transmit_packets_total")) == (2, 3, 30)
    # Containers: only those with a cgroup reading (running, shim answering); exited and gone ones are left out.
    by_id = {c.container_id: list(c.metrics) for c in pod.container_metrics}
    assert set(by_id) == {"c-run", "c-nolayer"}
    c = by_id["c-run"]
    assert list(c[0].label_values) == ["c-run", "docker.io/library/busybox:latest", "prod", "web", "c-run-name"]
    # Seconds are whole seconds (Metric.value is an integer), as CRI-O sends them.
    assert _value(c, "container_cpu_usage_seconds_total", cpu="total") == 2
    assert (_value(c, "container_cpu_user_seconds_total"), _value(c, "container_cpu_system_seconds_total")) == (1, 0)
    assert (_value(c, "container_cpu_cfs_periods_total"), _value(c, "container_cpu_cfs_throttled_periods_total"),
            _value(c, "container_cpu_cfs_throttled_seconds_total")) == (10, 3, 4)
    assert (_value(c, "container_memory_usage_bytes"), _value(c, "container_memory_working_set_bytes"),
            _value(c, "container_memory_rss"), _value(c, "container_memory_cache"),
            _value(c, "container_memory_mapped_file"), _value(c, "container_memory_swap"),
            _value(c, "container_memory_max_usage_bytes"), _value(c, "container_memory_failcnt")) == \
        (1000, 800, 500, 300, 70, 40, 1500, 1)
    assert _value(c, "container_memory_failures_total", failure_type="pgmajfault", scope="container") == 2
    assert _value(c, "container_memory_failures_total", failure_type="pgfault", scope="hierarchy") == 11
    assert _value(c, "container_oom_events_total") == 1
    assert _value(c, "container_threads_max") == 100
    assert (_value(c, "container_spec_memory_limit_bytes"), _value(c, "container_spec_cpu_shares"),
            _value(c, "container_spec_cpu_period"), _value(c, "container_spec_cpu_quota")) == \
        (256 << 20, 512, 100000, 50000)
    assert _value(c, "container_start_time_seconds") == 1_700_000_000
    assert abs(_value(c, "container_last_seen") - time.time()) < 3600
    assert _value(c, "container_fs_usage_bytes") == 8192
    assert (_value(c, "container_fs_reads_bytes_total", device="8:0"),
            _value(c, "container_fs_writes_bytes_total", device="8:0"),
            _value(c, "container_fs_reads_total", device="8:0")) == (4096, 8192, 1)
    # No layer usage (snapshot gone): only that series is missing.
    names = {m.name for m in by_id["c-nolayer"]}
    assert "container_fs_usage_bytes" not in names and "container_memory_usage_bytes" in names
    # pid 0: no process counts (the fake records have no real process).
    assert "container_processes" not in names


def test_no_limit_and_no_quota_read_as_cadvisor_does():
    rec = SimpleNamespace(id="x", config=_config(memory=0, quota=-1))
    values = {n: v for n, v, _ in metrics.spec_values(rec)}
    assert values["container_spec_memory_limit_bytes"] == 0 and "container_spec_cpu_quota" not in values
    assert list(metrics.spec_values(SimpleNamespace(id="x", config=b"\xff\xff"))) == []   # garbled: left out


def test_stream_yields_what_list_returns(svc, monkeypatch):
    async def collect(req):
        return [r async for r in metrics.stream_pod_sandbox_metrics(svc, req)]
    monkeypatch.setattr(metrics, "STREAM_CHUNK", 1)
    svc.store.put_sandbox(SandboxRecord(id="sb2", name="n3", pod_name="api", pod_uid="u3", pod_namespace="prod",
                                        attempt=0, state=SandboxState.READY, created_at=time.time_ns()))
    streamed = run(collect(pb.StreamPodSandboxMetricsRequest()))
    listed = run(metrics.list_pod_sandbox_metrics(svc, pb.ListPodSandboxMetricsRequest())).pod_metrics
    assert [len(r.pod_sandbox_metrics) for r in streamed] == [1, 1]
    got = sorted((p for r in streamed for p in r.pod_sandbox_metrics), key=lambda p: p.pod_sandbox_id)

    def shape(p):
        return p.pod_sandbox_id, sorted((m.name, tuple(m.label_values)) for m in _series(p))
    assert [shape(p) for p in got] == [shape(p) for p in sorted(listed, key=lambda p: p.pod_sandbox_id)]


def test_pod_stats_complete_for_kubelet(svc):
    (st,) = run(stats.list_pod_sandbox_stats(svc, pb.ListPodSandboxStatsRequest())).stats
    lx = st.linux
    # Two running containers with readings plus the pause: sums of the three.
    assert (lx.memory.usage_bytes.value, lx.memory.working_set_bytes.value, lx.memory.rss_bytes.value,
            lx.memory.page_faults.value, lx.memory.major_page_faults.value) == (3000, 2400, 1500, 33, 6)
    assert lx.memory.available_bytes.value == 2 * (GIB - 800)      # every container has a limit
    assert lx.process.process_count.value == 9
    assert lx.network.default_interface.name == "eth0" and lx.network.default_interface.rx_bytes.value == 5000
    assert [i.name for i in lx.network.interfaces] == ["eth0"]
    by_id = {c.attributes.id: c for c in lx.containers}
    assert set(by_id) == {"c-run", "c-gone", "c-exited", "c-nolayer"}
    c = by_id["c-run"]
    assert c.swap.swap_usage_bytes.value == 40 and c.swap.swap_available_bytes.value == 4096 - 40
    assert c.memory.rss_bytes.value == 500 and c.memory.major_page_faults.value == 2
    wl = c.writable_layer
    assert (wl.fs_id.mountpoint, wl.used_bytes.value, wl.inodes_used.value) == \
        ("/var/lib/husk/images/snapshots/active", 8192, 5)
    assert not by_id["c-exited"].HasField("cpu") and by_id["c-exited"].HasField("writable_layer")
    assert not by_id["c-nolayer"].HasField("writable_layer")
    # The shim of c-gone does not answer: its cpu is 0 and gives no rate, the call still succeeds.
    assert by_id["c-gone"].cpu.usage_core_nano_seconds.value == 0
    assert not by_id["c-gone"].cpu.HasField("usage_nano_cores")


def test_cpu_rate_needs_a_window():
    r = stats.CpuRates(min_window_ns=1_000_000_000)
    assert r.rate("a", 1_000_000_000, 0) == 0
    assert r.rate("a", 3_000_000_000, 1_000_000_000) == 500_000_000
    # A second caller right after: the same rate, and the baseline stays.
    assert r.rate("a", 3_000_001_000, 1_000_000_500) == 500_000_000
    assert r.rate("a", 5_000_000_000, 3_000_000_000) == 1_000_000_000


def test_missing_cpu_reading_is_not_a_sample():
    stats._rates.forget_missing(set())
    assert not stats.cpu_usage("z", None, 1_000_000_000).HasField("usage_nano_cores")
    stats.cpu_usage("z", _cgroup_metrics(1.0), 2_000_000_000)
    u = stats.cpu_usage("z", _cgroup_metrics(2.0), 4_000_000_000)
    assert u.usage_nano_cores.value == 500_000_000


def test_process_counts_of_this_process():
    a, b = socket.socketpair()
    try:
        p = stats.process_counts(os.getpid(), None)
    finally:
        a.close()
        b.close()
    assert p is not None and p.count >= 1 and p.threads >= p.count and p.fds >= 3
    assert 2 <= p.sockets < p.fds
    assert stats.process_counts(os.getpid(), 77).threads == 77
    assert stats.process_counts(2 ** 22 + 1, None) is None            # no such process


# What critest (cri-tools pkg/validate/pod.go, "runtime should support metrics operations") requires: these
# names in ListMetricDescriptors and, for a running container, a series of each in ListPodSandboxMetrics (block
# I/O may have none there: a virtual disk may count nothing).
CRITEST_SERIES = """container_cpu_cfs_periods_total container_cpu_cfs_throttled_periods_total
    container_cpu_cfs_throttled_seconds_total container_cpu_system_seconds_total container_cpu_usage_seconds_total
    container_cpu_user_seconds_total container_file_descriptors container_fs_inodes_free container_fs_inodes_total
    container_fs_limit_bytes container_fs_usage_bytes container_last_seen container_memory_cache
    container_memory_failcnt container_memory_failures_total container_memory_kernel_usage
    container_memory_mapped_file container_memory_max_usage_bytes container_memory_rss container_memory_swap
    container_memory_usage_bytes container_memory_working_set_bytes container_network_receive_bytes_total
    container_network_receive_errors_total container_network_receive_packets_dropped_total
    container_network_receive_packets_total container_network_transmit_bytes_total
    container_network_transmit_errors_total container_network_transmit_packets_dropped_total
    container_network_transmit_packets_total container_oom_events_total container_processes container_sockets
    container_spec_cpu_period container_spec_cpu_shares container_spec_memory_limit_bytes
    container_spec_memory_swap_limit_bytes container_start_time_seconds container_threads
    container_threads_max""".split()
CRITEST_OPTIONAL = """container_blkio_device_usage_total container_fs_reads_bytes_total container_fs_reads_total
    container_fs_writes_bytes_total container_fs_writes_total""".split()


def test_the_series_critest_requires(svc, tmp_path, monkeypatch):
    assert set(CRITEST_SERIES + CRITEST_OPTIONAL) <= set(_descs(svc))
    svc.images.snapshots = SimpleNamespace(active_dir=str(tmp_path))
    monkeypatch.setattr(stats, "process_counts",
                        lambda pid, tasks: stats.Processes(count=1, threads=2, fds=5, sockets=1))
    svc.store.put_container(dataclasses.replace(svc.store.get_container("c-run"), pid=4343))
    (pod,) = run(metrics.list_pod_sandbox_metrics(svc, pb.ListPodSandboxMetricsRequest())).pod_metrics
    c = next(c for c in pod.container_metrics if c.container_id == "c-run")
    assert set(CRITEST_SERIES) <= {m.name for m in [*pod.metrics, *c.metrics]}
    ms = list(c.metrics)
    assert (_value(ms, "container_memory_kernel_usage"), _value(ms, "container_sockets")) == (64, 1)
    st = os.statvfs(tmp_path)
    assert (_value(ms, "container_fs_limit_bytes"), _value(ms, "container_fs_inodes_total")) == \
        (st.f_blocks * st.f_frsize, st.f_files)
    assert 0 < _value(ms, "container_fs_inodes_free") <= st.f_files
    assert _value(ms, "container_blkio_device_usage_total", device="8:0", major="8", minor="0",
                  operation="write") == 8192


def _write(d, files: dict[str, str]) -> None:
    for name, text in files.items():
        (d / name).write_text(text)


def test_shim_v1_memsw_and_blkio(tmp_path):
    mem, blk = tmp_path / "memory", tmp_path / "blkio"
    mem.mkdir()
    blk.mkdir()
    _write(mem, {"memory.stat": "total_rss 5\n", "memory.usage_in_bytes": "100\n", "memory.limit_in_bytes": "200\n",
                 "memory.max_usage_in_bytes": "150\n", "memory.failcnt": "2\n", "memory.oom_control": "oom_kill 0\n",
                 "memory.memsw.usage_in_bytes": "130\n", "memory.memsw.limit_in_bytes": "300\n",
                 "memory.memsw.max_usage_in_bytes": "0\n", "memory.memsw.failcnt": "0\n",
                 "memory.kmem.usage_in_bytes": "40\n", "memory.kmem.limit_in_bytes": "9223372036854771712\n",
                 "memory.kmem.max_usage_in_bytes": "50\n", "memory.kmem.failcnt": "0\n"})
    _write(blk, {"blkio.throttle.io_service_bytes_recursive": "8:0 Read 4096\n8:0 Write 512\n8:0 Sync 0\nTotal 4608\n",
                 "blkio.throttle.io_serviced_recursive": "8:0 Read 2\n8:0 Write 1\nTotal 3\n"})
    m = cgroup_watch.metrics(V1Manager("/", hier={"memory": str(mem), "blkio": str(blk)}))
    assert (m.memory.usage.usage, m.memory.usage.max, m.memory.usage.failcnt) == (100, 150, 2)
    assert (m.memory.swap.usage, m.memory.swap.limit) == (130, 300)
    assert (m.memory.kernel.usage, stats.memory_of(m).kernel) == (40, 40)
    assert [(e.op, e.major, e.minor, e.value) for e in m.blkio.io_service_bytes_recursive] == \
        [("Read", 8, 0, 4096), ("Write", 8, 0, 512), ("Sync", 8, 0, 0)]
    f = stats.memory_of(m)
    assert (f.swap, f.swap_limit, f.swap_available) == (30, 100, 70)
    # Without swap accounting there is no swap figure.
    os.unlink(mem / "memory.memsw.usage_in_bytes")
    m = cgroup_watch.metrics(V1Manager("/", hier={"memory": str(mem)}))
    assert m.memory.swap is None and stats.memory_of(m).swap is None and m.blkio is None


def test_shim_v2_swap_peak_and_io(tmp_path):
    _write(tmp_path, {"memory.stat": "anon 7\nfile 3\ninactive_file 2\npgfault 9\npgmajfault 1\n",
                      "memory.current": "100\n", "memory.max": "1000\n", "memory.peak": "120\n",
                      "memory.events": "oom_kill 2\n", "memory.swap.current": "25\n", "memory.swap.max": "max\n",
                      "cpu.stat": "usage_usec 10\n",
                      "io.stat": "8:0 rbytes=4096 wbytes=512 rios=2 wios=1 dbytes=0 dios=0\n"})
    m = cgroup_watch.metrics(V2Manager("/", str(tmp_path)))
    assert (m.memory.usage.usage, m.memory.usage.max) == (100, 120)
    assert (m.memory.swap.usage, m.memory.swap.limit) == (125, 0)       # memory + swap; no swap limit
    f = stats.memory_of(m)
    assert (f.swap, f.swap_limit, f.page_faults, f.rss) == (25, None, 9, 7)
    assert [(e.op, e.value) for e in m.blkio.io_service_bytes_recursive] == [("Read", 4096), ("Write", 512)]
    assert [(e.op, e.value) for e in m.blkio.io_serviced_recursive] == [("Read", 2), ("Write", 1)]
    assert m.memory_oom_control.oom_kill == 2
    assert m.memory.kernel.usage == 0 and f.kernel == 0       # no kernel counters in this memory.stat
    (tmp_path / "memory.stat").write_text("anon 7\nkernel_stack 16\npagetables 8\nslab 100\nsock 3\n")
    assert stats.memory_of(cgroup_watch.metrics(V2Manager("/", str(tmp_path)))).kernel == 124
    (tmp_path / "memory.stat").write_text("anon 7\nkernel 300\nkernel_stack 16\nslab 100\n")
    assert stats.memory_of(cgroup_watch.metrics(V2Manager("/", str(tmp_path)))).kernel == 300
    (tmp_path / "memory.swap.max").write_text("0\n")                    # swap off for this cgroup
    f = stats.memory_of(cgroup_watch.metrics(V2Manager("/", str(tmp_path))))
    assert (f.swap_limit, f.swap_available) == (0, 0)


def test_an_undecodable_shim_answer_drops_only_that_container(svc):
    svc.store.put_container(ContainerRecord(id="c-garbled", sandbox_id="sb1", name="g", container_name="g",
                                            attempt=0, state=ContainerState.RUNNING, created_at=1,
                                            shim_address="unix:///s/g", config=_config()))
    svc.shims.by_id["c-garbled"] = b"\x0a\xff\xff\xff"
    (pod,) = run(metrics.list_pod_sandbox_metrics(svc, pb.ListPodSandboxMetricsRequest())).pod_metrics
    assert {c.container_id for c in pod.container_metrics} == {"c-run", "c-nolayer"}
    (st,) = run(stats.list_pod_sandbox_stats(svc, pb.ListPodSandboxStatsRequest())).stats
    assert "c-garbled" in {c.attributes.id for c in st.linux.containers}


# -- readings shared between callers (rpc/stats.py's Recent) --------------------------------------------------

class CountingShims(FakeShims):
    def __init__(self, by_id, delay: float = 0.0) -> None:
        super().__init__(by_id)
        self.calls: list[str] = []
        self.delay = delay

    async def call(self, object_id, address, method, timeout=None, **kw):
        self.calls.append(object_id)
        if self.delay:
            await asyncio.sleep(self.delay)
        return await super().call(object_id, address, method, timeout, **kw)


class CountingImages(FakeImages):
    def __init__(self) -> None:
        self.walks: list[str] = []
        self.bytes = 8192

    def usage(self, key):
        self.walks.append(key)
        return SimpleNamespace(bytes=self.bytes, inodes=5) if key != "c-nolayer" else super().usage(key)


def test_pod_then_container_stats_read_each_shim_once(svc):
    svc.shims = CountingShims(svc.shims.by_id)
    (pod,) = run(stats.list_pod_sandbox_stats(svc, pb.ListPodSandboxStatsRequest())).stats
    assert sorted(svc.shims.calls) == ["c-gone", "c-nolayer", "c-run", "sb1"]
    listed = {s.attributes.id: s for s in
              run(stats.list_container_stats(svc, pb.ListContainerStatsRequest())).stats}
    # Right after: the same readings answer (the shim that did not answer is asked again), with their own time.
    assert sorted(svc.shims.calls) == ["c-gone", "c-gone", "c-nolayer", "c-run", "sb1"]
    in_pod = {c.attributes.id: c for c in pod.linux.containers}
    assert listed["c-run"].cpu == in_pod["c-run"].cpu and listed["c-run"].memory == in_pod["c-run"].memory


def test_concurrent_callers_share_one_shim_call_and_old_readings_are_read_again(svc, monkeypatch):
    svc.shims = CountingShims(svc.shims.by_id, delay=0.05)
    r = svc.store.get_container("c-run")

    async def both():
        return await asyncio.gather(stats.sample_container(svc, r), stats.sample_container(svc, r))
    a, b = run(both())
    assert svc.shims.calls == ["c-run"] and a.now == b.now and a.metrics is b.metrics
    monkeypatch.setattr(stats, "_READING_MAX_AGE_NS", 0)
    c = run(stats.sample_container(svc, r))
    assert svc.shims.calls == ["c-run", "c-run"] and c.now > a.now
    # A reading is kept for the shim it came from only.
    monkeypatch.setattr(stats, "_READING_MAX_AGE_NS", 10**12)
    run(stats.sample_container(svc, r))
    moved = ContainerRecord(**{**r.__dict__, "shim_address": "unix:///s/elsewhere"})
    run(stats.sample_container(svc, moved))
    assert svc.shims.calls == ["c-run"] * 3


def test_a_cancelled_caller_does_not_cancel_the_shared_reading(svc):
    svc.shims = CountingShims(svc.shims.by_id, delay=0.05)
    r = svc.store.get_container("c-run")

    async def go():
        first = asyncio.ensure_future(stats.sample_container(svc, r))
        await wait_for_async(lambda: svc.shims.calls, 5, "the first caller's shim call to start", interval=0.001)
        second = asyncio.ensure_future(stats.sample_container(svc, r))
        await asyncio.sleep(0)
        first.cancel()
        return await second
    s = run(go())
    assert svc.shims.calls == ["c-run"] and s.metrics is not None


def test_layers_are_walked_at_most_once_per_max_age_with_the_walks_time(svc, monkeypatch):
    svc.images = CountingImages()
    t0 = time.time_ns()
    first = run(stats.container_stats(svc, pb.ContainerStatsRequest(container_id="c-run"))).stats
    svc.images.bytes = 16384
    again = run(stats.container_stats(svc, pb.ContainerStatsRequest(container_id="c-run"))).stats
    assert svc.images.walks == ["c-run"]
    assert again.writable_layer == first.writable_layer and first.writable_layer.timestamp >= t0
    # A walk that failed is not kept: the next call walks again.
    run(stats.container_stats(svc, pb.ContainerStatsRequest(container_id="c-nolayer")))
    run(stats.container_stats(svc, pb.ContainerStatsRequest(container_id="c-nolayer")))
    assert svc.images.walks.count("c-nolayer") == 2
    monkeypatch.setattr(stats, "_LAYER_MAX_AGE_NS", 0)
    fresh = run(stats.container_stats(svc, pb.ContainerStatsRequest(container_id="c-run"))).stats
    assert fresh.writable_layer.used_bytes.value == 16384
    assert fresh.writable_layer.timestamp > first.writable_layer.timestamp


def test_readings_of_removed_objects_are_dropped(svc):
    run(stats.list_pod_sandbox_stats(svc, pb.ListPodSandboxStatsRequest()))
    rd = stats.readings(svc)
    assert "c-run" in rd.metrics._values and "c-run" in rd.layers._values
    svc.store.delete_container("c-run")
    run(stats.list_container_stats(svc, pb.ListContainerStatsRequest()))
    assert "c-run" not in rd.metrics._values and "c-run" not in rd.layers._values and "sb1" in rd.metrics._values


def test_upb_decoding_gives_what_the_shim_codec_gives():
    from cri_server.rpc import cgdecode
    full = _cgroup_metrics()
    full.hugetlb = [cg.HugetlbStat(usage=5, max=6, failcnt=1, pagesize="2MB"), cg.HugetlbStat(pagesize="1GB")]
    full.cpu.usage.per_cpu = [1, 2**63, 0, 7]
    for m in (full, _cgroup_metrics(), cg.Metrics(), cg.Metrics(memory=cg.MemoryStat(usage=cg.MemoryEntry()))):
        data = m.encode()
        got = cgdecode.decode(cg.Metrics, data)
        assert got == cg.Metrics.decode(data) and repr(got) == repr(cg.Metrics.decode(data))
    # Presence as the shim codec has it: a sub-message that was not sent is None, one sent empty is not.
    got = cgdecode.decode(cg.Metrics, cg.Metrics(memory=cg.MemoryStat(usage=cg.MemoryEntry())).encode())
    assert got.cpu is None and got.memory.usage is not None and got.memory.swap is None and got.hugetlb == []
    with pytest.raises(ValueError):
        cgdecode.decode(cg.Metrics, b"\x0a\xff\xff\xff")
