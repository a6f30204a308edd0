"""ListMetricDescriptors, ListPodSandboxMetrics, StreamPodSandboxMetrics: cAdvisor's container series from
the same samples as the stats RPCs (rpc/stats.py), for kubelet's /metrics/cadvisor when its
PodAndContainerStatsFromCRI gate is on (kubelet turns each Metric into a Prometheus sample of the descriptor
with that name).

Names, label keys and units follow CRI-O, which the gate was built against: every series has the labels
id, image, namespace, pod, container (then its own: cpu, interface, device...), values are whole units
(seconds and bytes; Metric.value is an integer), network is per pod (container "POD"), the rest per running
container. A container whose shim does not answer has only the series that need no shim.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import AsyncIterator, Iterator

from google.protobuf.message import DecodeError

from cri_server.api.v1 import api_pb2 as pb
from cri_server.context import Services
from cri_server.rpc import stats
from cri_server.rpc.stats import ContainerSample, PodSample

log = logging.getLogger(__name__)

BASE_LABELS = ("id", "image", "namespace", "pod", "container")
NS = 1_000_000_000
COUNTER, GAUGE = pb.COUNTER, pb.GAUGE
# Streamed responses carry this many pods each.
STREAM_CHUNK = 50


@dataclass(frozen=True)
class Desc:
    name: str
    help: str
    type: int
    extra: tuple[str, ...] = ()    # label keys after BASE_LABELS

    @property
    def label_keys(self) -> tuple[str, ...]:
        return BASE_LABELS + self.extra


_IFACE = ("interface",)
_DEVICE = ("device",)
DESCRIPTORS = {d.name: d for d in (
    Desc("container_last_seen", "Last time a container was seen by the exporter", GAUGE),
    Desc("container_start_time_seconds", "Start time of the container since unix epoch in seconds.", GAUGE),
    # cpu
    Desc("container_cpu_usage_seconds_total", "Cumulative CPU time consumed in seconds.", COUNTER, ("cpu",)),
    Desc("container_cpu_user_seconds_total", "Cumulative user CPU time consumed in seconds.", COUNTER),
    Desc("container_cpu_system_seconds_total", "Cumulative system CPU time consumed in seconds.", COUNTER),
    Desc("container_cpu_cfs_periods_total", "Number of elapsed enforcement period intervals.", COUNTER),
    Desc("container_cpu_cfs_throttled_periods_total", "Number of throttled period intervals.", COUNTER),
    Desc("container_cpu_cfs_throttled_seconds_total", "Total time duration the container has been throttled.",
         COUNTER),
    # memory
    Desc("container_memory_cache", "Number of bytes of page cache memory.", GAUGE),
    Desc("container_memory_rss", "Size of RSS in bytes.", GAUGE),
    Desc("container_memory_mapped_file", "Size of memory mapped files in bytes.", GAUGE),
    Desc("container_memory_swap", "Container swap usage in bytes.", GAUGE),
    Desc("container_memory_failcnt", "Number of memory usage hits limits", COUNTER),
    Desc("container_memory_kernel_usage", "Size of kernel memory allocated in bytes.", GAUGE),
    Desc("container_memory_usage_bytes",
         "Current memory usage in bytes, including all memory regardless of when it was accessed", GAUGE),
    Desc("container_memory_max_usage_bytes", "Maximum memory usage recorded in bytes", GAUGE),
    Desc("container_memory_working_set_bytes", "Current working set in bytes.", GAUGE),
    Desc("container_memory_failures_total", "Cumulative count of memory allocation failures.", COUNTER,
         ("failure_type", "scope")),
    Desc("container_oom_events_total", "Count of out of memory events observed for the container", COUNTER),
    # processes
    Desc("container_processes", "Number of processes running inside the container.", GAUGE),
    Desc("container_threads", "Number of threads running inside the container", GAUGE),
    Desc("container_threads_max",
         "Maximum number of threads allowed inside the container, infinity if value is zero", GAUGE),
    Desc("container_file_descriptors", "Number of open file descriptors for the container.", GAUGE),
    Desc("container_sockets", "Number of open sockets for the container.", GAUGE),
    # spec
    Desc("container_spec_memory_limit_bytes", "Memory limit for the container in bytes.", GAUGE),
    Desc("container_spec_memory_swap_limit_bytes", "Memory swap limit for the container.", GAUGE),
    Desc("container_spec_memory_reservation_limit_bytes", "Memory reservation limit for the container.", GAUGE),
    Desc("container_spec_cpu_period", "CPU period of the container.", GAUGE),
    Desc("container_spec_cpu_quota", "CPU quota of the container.", GAUGE),
    Desc("container_spec_cpu_shares", "CPU share of the container.", GAUGE),
    # filesystem
    Desc("container_fs_usage_bytes", "Current filesystem usage in bytes.", GAUGE),
    Desc("container_fs_limit_bytes", "Filesystem limit in bytes.", GAUGE),
    Desc("container_fs_inodes_total", "Total number of inodes.", GAUGE),
    Desc("container_fs_inodes_free", "Number of free inodes.", GAUGE),
    Desc("container_fs_reads_bytes_total", "Cumulative count of bytes read", COUNTER, _DEVICE),
    Desc("container_fs_writes_bytes_total", "Cumulative count of bytes written", COUNTER, _DEVICE),
    Desc("container_fs_reads_total", "Cumulative count of reads completed", COUNTER, _DEVICE),
    Desc("container_fs_writes_total", "Cumulative count of writes completed", COUNTER, _DEVICE),
    Desc("container_blkio_device_usage_total", "Blkio Device bytes usage", COUNTER,
         ("device", "major", "minor", "operation")),
    # network (per pod)
    Desc("container_network_receive_bytes_total", "Cumulative count of bytes received", COUNTER, _IFACE),
    Desc("container_network_receive_packets_total", "Cumulative count of packets received", COUNTER, _IFACE),
    Desc("container_network_receive_packets_dropped_total", "Cumulative count of packets dropped while receiving",
         COUNTER, _IFACE),
    Desc("container_network_receive_errors_total", "Cumulative count of errors encountered while receiving",
         COUNTER, _IFACE),
    Desc("container_network_transmit_bytes_total", "Cumulative count of bytes transmitted", COUNTER, _IFACE),
    Desc("container_network_transmit_packets_total", "Cumulative count of packets transmitted", COUNTER, _IFACE),
    Desc("container_network_transmit_packets_dropped_total",
         "Cumulative count of packets dropped while transmitting", COUNTER, _IFACE),
    Desc("container_network_transmit_errors_total", "Cumulative count of errors encountered while transmitting",
         COUNTER, _IFACE),
)}

# (series, Interface attribute)
_NETWORK = (("receive_bytes", "rx_bytes"), ("receive_packets", "rx_packets"),
            ("receive_packets_dropped", "rx_dropped"), ("receive_errors", "rx_errors"),
            ("transmit_bytes", "tx_bytes"), ("transmit_packets", "tx_packets"),
            ("transmit_packets_dropped", "tx_dropped"), ("transmit_errors", "tx_errors"))

# A value: (series name, value, the labels after BASE_LABELS)
Value = tuple[str, int, tuple[str, ...]]


def _metric(name: str, value: int, base: list[str], extra: tuple[str, ...], now: int) -> pb.Metric:
    d = DESCRIPTORS[name]
    if len(extra) != len(d.extra):
        raise ValueError(f"{name}: {len(extra)} label values for the label keys {d.extra}")
    return pb.Metric(name=name, timestamp=now, metric_type=d.type, label_values=[*base, *extra],
                     value=pb.UInt64Value(value=max(int(value), 0)))


def cgroup_values(m: object) -> Iterator[Value]:
    """The series read from a task's cgroup metrics (io.containerd.cgroups.v1.Metrics)."""
    cpu = getattr(m, "cpu", None)
    if cpu is not None and cpu.usage is not None:
        yield "container_cpu_usage_seconds_total", cpu.usage.total // NS, ("total",)
        yield "container_cpu_user_seconds_total", cpu.usage.user // NS, ()
        yield "container_cpu_system_seconds_total", cpu.usage.kernel // NS, ()
    if cpu is not None and cpu.throttling is not None:
        t = cpu.throttling
        yield "container_cpu_cfs_periods_total", t.periods, ()
        yield "container_cpu_cfs_throttled_periods_total", t.throttled_periods, ()
        yield "container_cpu_cfs_throttled_seconds_total", t.throttled_time // NS, ()
    f = stats.memory_of(m)
    if f is not None:
        yield "container_memory_cache", f.cache, ()
        yield "container_memory_rss", f.rss, ()
        yield "container_memory_mapped_file", f.mapped_file, ()
        yield "container_memory_swap", f.swap or 0, ()
        yield "container_memory_failcnt", f.failcnt, ()
        if f.kernel is not None:
            yield "container_memory_kernel_usage", f.kernel, ()
        yield "container_memory_usage_bytes", f.usage, ()
        if f.max_usage:                # v1, or v2 with memory.peak
            yield "container_memory_max_usage_bytes", f.max_usage, ()
        yield "container_memory_working_set_bytes", f.working_set, ()
        for kind, v in (("pgfault", f.page_faults), ("pgmajfault", f.major_page_faults)):
            for scope in ("container", "hierarchy"):
                yield "container_memory_failures_total", v, (kind, scope)
    oom = getattr(m, "memory_oom_control", None)
    if oom is not None:
        yield "container_oom_events_total", oom.oom_kill, ()
    pids = getattr(m, "pids", None)
    if pids is not None:
        yield "container_threads_max", pids.limit, ()
    blkio = getattr(m, "blkio", None)
    if blkio is not None:
        for entries, kind in ((blkio.io_service_bytes_recursive, "bytes_total"),
                              (blkio.io_serviced_recursive, "total")):
            for e in entries or ():
                if e.op in ("Read", "Write"):
                    yield f"container_fs_{e.op.lower()}s_{kind}", e.value, (f"{e.major}:{e.minor}",)
        for e in blkio.io_service_bytes_recursive or ():       # every operation the cgroup counts, as CRI-O
            yield ("container_blkio_device_usage_total", e.value,
                   (f"{e.major}:{e.minor}", str(e.major), str(e.minor), e.op.lower()))


def spec_values(r: object) -> Iterator[Value]:
    """The container's resources as last set (CreateContainer or UpdateContainerResources)."""
    config = getattr(r, "config", b"")
    try:
        res = pb.ContainerConfig.FromString(config).linux.resources
    except DecodeError as e:
        log.debug("no spec metrics: %s", e, extra={"id": getattr(r, "id", "")})
        return
    yield "container_spec_memory_limit_bytes", _spec_memory(res.memory_limit_in_bytes), ()
    yield "container_spec_memory_swap_limit_bytes", _spec_memory(res.memory_swap_limit_in_bytes), ()
    yield "container_spec_cpu_shares", res.cpu_shares, ()
    yield "container_spec_cpu_period", res.cpu_period, ()
    if res.cpu_quota > 0:
        yield "container_spec_cpu_quota", res.cpu_quota, ()
    reservation = res.unified.get("memory.min", "0")
    if reservation.isdigit():
        yield "container_spec_memory_reservation_limit_bytes", _spec_memory(int(reservation)), ()


def _spec_memory(v: int) -> int:
    return v if stats.limited(v) else 0    # cAdvisor: no limit is 0


def container_values(s: ContainerSample) -> Iterator[Value]:
    yield "container_last_seen", s.now // NS, ()
    yield "container_start_time_seconds", s.record.created_at // NS, ()
    yield from spec_values(s.record)
    if s.metrics is not None:
        yield from cgroup_values(s.metrics)
    if s.processes is not None:
        yield "container_processes", s.processes.count, ()
        yield "container_threads", s.processes.threads, ()
        yield "container_file_descriptors", s.processes.fds, ()
        yield "container_sockets", s.processes.sockets, ()
    if s.layer is not None:
        yield "container_fs_usage_bytes", s.layer.bytes, ()
        yield from fs_values(s.layer.mountpoint)


def fs_values(path: str) -> Iterator[Value]:
    """Size and inodes of the filesystem holding the writable layers (cAdvisor's and CRI-O's
    container_fs_limit_bytes, container_fs_inodes_total, container_fs_inodes_free)."""
    try:
        st = os.statvfs(path)
    except OSError as e:
        log.debug("no filesystem metrics", extra={"path": path, "error": str(e)})
        return
    yield "container_fs_limit_bytes", st.f_blocks * st.f_frsize, ()
    yield "container_fs_inodes_total", st.f_files, ()
    yield "container_fs_inodes_free", st.f_ffree, ()


def pod_values(p: PodSample) -> Iterator[Value]:
    for i in p.network or ():
        for series, attr in _NETWORK:
            yield f"container_network_{series}_total", getattr(i, attr), (i.name,)


def pod_metrics_from(p: PodSample) -> pb.PodSandboxMetrics:
    sb = p.sandbox
    out = pb.PodSandboxMetrics(pod_sandbox_id=sb.id)
    base = [sb.id, "", sb.pod_namespace, sb.pod_name, "POD"]
    out.metrics.extend(_metric(n, v, base, extra, p.now) for n, v, extra in pod_values(p))
    for c in p.containers:
        r = c.record
        if c.metrics is None:          # not running, or its shim is gone
            continue
        base = [r.id, r.image or r.image_ref, sb.pod_namespace, sb.pod_name, r.container_name]
        out.container_metrics.append(pb.ContainerMetrics(
            container_id=r.id, metrics=[_metric(n, v, base, extra, c.now) for n, v, extra in container_values(c)]))
    return out


async def list_metric_descriptors(svc: Services,
                                  req: pb.ListMetricDescriptorsRequest) -> pb.ListMetricDescriptorsResponse:
    """ListMetricDescriptors: the name, help and label keys of every series ListPodSandboxMetrics sends."""
    return pb.ListMetricDescriptorsResponse(descriptors=[
        pb.MetricDescriptor(name=d.name, help=d.help, label_keys=d.label_keys) for d in DESCRIPTORS.values()])


async def _all_pods(svc: Services) -> list[pb.PodSandboxMetrics]:
    pacer = stats.Pacer()      # sampled and built in slices, as the stats RPCs (rpc/stats.py)
    samples = await stats.sweep(stats.ready_sandboxes(svc), lambda sb: stats.sample_pod(svc, sb, processes=True),
                                pacer)
    stats.forget_gone(svc)
    return await stats.paced(samples, pod_metrics_from, pacer)


async def list_pod_sandbox_metrics(svc: Services,
                                   req: pb.ListPodSandboxMetricsRequest) -> pb.ListPodSandboxMetricsResponse:
    """ListPodSandboxMetrics: the series of every ready pod and its running containers, read now (a shim
    reading of the last 0.5 s and a layer walk of the last 10 s answer again, see rpc/stats.py)."""
    return pb.ListPodSandboxMetricsResponse(pod_metrics=await _all_pods(svc))


async def stream_pod_sandbox_metrics(svc: Services, req: pb.StreamPodSandboxMetricsRequest
                                     ) -> AsyncIterator[pb.StreamPodSandboxMetricsResponse]:
    """StreamPodSandboxMetrics: what ListPodSandboxMetrics returns, STREAM_CHUNK pods per message."""
    pods = await _all_pods(svc)
    for i in range(0, len(pods), STREAM_CHUNK):
        yield pb.StreamPodSandboxMetricsResponse(pod_sandbox_metrics=pods[i:i + STREAM_CHUNK])
