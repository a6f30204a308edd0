"""ContainerStats, ListContainerStats, PodSandboxStats, ListPodSandboxStats.

CPU and memory come from each running task's shim (its cgroup metrics), CPU rate from the previous sample,
the writable layer from the image service (a walk of the container's upper dir, in a thread), network from
the pod's namespace (/proc/<pause>/net/dev). Containers that are not running report only their writable layer.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from cri_server.api.v1 import api_pb2 as pb
from cri_server.context import Services
from cri_server.shims import ShimGone
from cri_server.store.records import ContainerFilter, ContainerRecord, ContainerState, SandboxFilter, \
    SandboxRecord, SandboxState

log = logging.getLogger(__name__)

# Kernel memory limits this large mean "no limit".
_UNLIMITED = 1 << 62


class CpuRates:
    """The previous CPU sample per object, for usage_nano_cores (kubelet's summary API wants a rate)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, int]] = {}

    def rate(self, object_id: str, now_ns: int, total_ns: int) -> int | None:
        prev = self._last.get(object_id)
        self._last[object_id] = (now_ns, total_ns)
        if prev is None or now_ns <= prev[0] or total_ns < prev[1]:
            return None
        return (total_ns - prev[1]) * 1_000_000_000 // (now_ns - prev[0])

    def forget_missing(self, live: set[str]) -> None:
        for k in [k for k in self._last if k not in live]:
            del self._last[k]


_rates = CpuRates()


def _u64(v: int | None) -> pb.UInt64Value | None:
    return None if v is None else pb.UInt64Value(value=max(int(v), 0))


async def _metrics(svc: Services, object_id: str, address: str) -> Any:
    from shim import ttrpc_wire as w
    from shim.pb import cgroups_v1
    if not address:
        return None
    try:
        resp = await svc.need_shims().call(object_id, address, "Stats", timeout=10.0, id=object_id)
    except (ShimGone, w.TtrpcError) as e:
        log.debug("no stats", extra={"id": object_id, "error": str(e)})
        return None
    if resp.stats is None or not resp.stats.value:
        return None
    return cgroups_v1.Metrics.decode(resp.stats.value)


def cpu_usage(object_id: str, m: Any, now: int) -> pb.CpuUsage:
    total = m.cpu.usage.total if m is not None and m.cpu is not None and m.cpu.usage is not None else 0
    return pb.CpuUsage(timestamp=now, usage_core_nano_seconds=_u64(total),
                       usage_nano_cores=_u64(_rates.rate(object_id, now, total)))


def memory_usage(m: Any, now: int) -> pb.MemoryUsage:
    mem = m.memory if m is not None else None
    if mem is None:
        return pb.MemoryUsage(timestamp=now, working_set_bytes=_u64(0), usage_bytes=_u64(0))
    usage = mem.usage.usage if mem.usage is not None else 0
    inactive = mem.total_inactive_file or mem.inactive_file
    working = usage - inactive if usage > inactive else 0
    limit = mem.usage.limit if mem.usage is not None else 0
    available = limit - working if 0 < limit < _UNLIMITED and limit > working else None
    return pb.MemoryUsage(timestamp=now, working_set_bytes=_u64(working), usage_bytes=_u64(usage),
                          available_bytes=_u64(available), rss_bytes=_u64(mem.total_rss or mem.rss),
                          page_faults=_u64(mem.total_pg_fault or mem.pg_fault),
                          major_page_faults=_u64(mem.total_pg_maj_fault or mem.pg_maj_fault))


async def writable_layer(svc: Services, container_id: str, now: int) -> pb.FilesystemUsage | None:
    images = svc.images
    if images is None:
        return None
    try:
        u = await asyncio.to_thread(images.usage, container_id)
    except Exception as e:  # noqa: BLE001 -- a snapshot that vanished has no usage; never fail the stats call
        log.debug("no writable layer usage", extra={"id": container_id, "error": str(e)})
        return None
    return pb.FilesystemUsage(timestamp=now, fs_id=pb.FilesystemIdentifier(mountpoint=images.snapshots.active_dir),
                              used_bytes=_u64(u.bytes), inodes_used=_u64(u.inodes))


async def container_stats_of(svc: Services, r: ContainerRecord, m: Any = None, fetch: bool = True) -> pb.ContainerStats:
    now = time.time_ns()
    if fetch and r.state == ContainerState.RUNNING:
        m = await _metrics(svc, r.id, r.shim_address)
    st = pb.ContainerStats(attributes=pb.ContainerAttributes(
        id=r.id, metadata=pb.ContainerMetadata(name=r.container_name, attempt=r.attempt),
        labels=r.labels, annotations=r.annotations))
    if r.state == ContainerState.RUNNING:
        st.cpu.CopyFrom(cpu_usage(r.id, m, now))
        st.memory.CopyFrom(memory_usage(m, now))
    layer = await writable_layer(svc, r.id, now)
    if layer is not None:
        st.writable_layer.CopyFrom(layer)
    return st


async def container_stats(svc: Services, req: pb.ContainerStatsRequest) -> pb.ContainerStatsResponse:
    """ContainerStats returns cpu, memory and writable-layer usage of one container; NotFound if unknown."""
    r = svc.store.get_container(req.container_id)
    return pb.ContainerStatsResponse(stats=await container_stats_of(svc, r))


async def list_container_stats(svc: Services, req: pb.ListContainerStatsRequest) -> pb.ListContainerStatsResponse:
    """ListContainerStats returns the stats of every container matching the filter (id, pod, labels)."""
    f = req.filter
    flt = ContainerFilter(id=f.id, sandbox_id=f.pod_sandbox_id, label_selector=dict(f.label_selector)) \
        if req.HasField("filter") else ContainerFilter()
    recs = [r for r in svc.store.list_containers(flt) if not r.extra.get("creating")]
    stats = await asyncio.gather(*(container_stats_of(svc, r) for r in recs))
    _rates.forget_missing({r.id for r in svc.store.list_containers()} | {s.id for s in svc.store.list_sandboxes()})
    return pb.ListContainerStatsResponse(stats=stats)


def network_usage(pid: int, now: int) -> pb.NetworkUsage | None:
    """Interface counters of the namespace `pid` lives in (eth0 is the pod's default interface)."""
    try:
        with open(f"/proc/{pid}/net/dev") as f:
            lines = f.readlines()[2:]
    except OSError:
        return None
    out = pb.NetworkUsage(timestamp=now)
    for line in lines:
        name, _, rest = line.partition(":")
        name = name.strip()
        v = rest.split()
        if name == "lo" or len(v) < 16:
            continue
        iface = pb.NetworkInterfaceUsage(name=name, rx_bytes=_u64(int(v[0])), rx_errors=_u64(int(v[2])),
                                         tx_bytes=_u64(int(v[8])), tx_errors=_u64(int(v[10])))
        if name == "eth0":
            out.default_interface.CopyFrom(iface)
        out.interfaces.append(iface)
    return out


async def sandbox_stats_of(svc: Services, sb: SandboxRecord) -> pb.PodSandboxStats:
    now = time.time_ns()
    containers = [c for c in svc.store.containers_of(sb.id) if not c.extra.get("creating")]
    pause_m = await _metrics(svc, sb.id, sb.shim_address) if sb.state == SandboxState.READY else None
    metrics = await asyncio.gather(*(_metrics(svc, c.id, c.shim_address) if c.state == ContainerState.RUNNING
                                     else _none() for c in containers))
    linux = pb.LinuxPodSandboxStats()
    linux.containers.extend(await asyncio.gather(*(container_stats_of(svc, c, m, fetch=False)
                                                   for c, m in zip(containers, metrics))))
    # The pod's usage: the pause container plus every running container (each has its own cgroup).
    total_cpu = total_mem = total_ws = 0
    count = 0
    for m in [pause_m, *metrics]:
        if m is None:
            continue
        if m.cpu is not None and m.cpu.usage is not None:
            total_cpu += m.cpu.usage.total
        mu = memory_usage(m, now)
        total_mem += mu.usage_bytes.value
        total_ws += mu.working_set_bytes.value
        if m.pids is not None:
            count += m.pids.current
    linux.cpu.CopyFrom(pb.CpuUsage(timestamp=now, usage_core_nano_seconds=_u64(total_cpu),
                                   usage_nano_cores=_u64(_rates.rate(sb.id, now, total_cpu))))
    linux.memory.CopyFrom(pb.MemoryUsage(timestamp=now, working_set_bytes=_u64(total_ws),
                                         usage_bytes=_u64(total_mem)))
    linux.process.CopyFrom(pb.ProcessUsage(timestamp=now, process_count=_u64(count)))
    if sb.state == SandboxState.READY and sb.netns_path and sb.pid:
        net = network_usage(sb.pid, now)
        if net is not None:
            linux.network.CopyFrom(net)
    md = pb.PodSandboxMetadata(name=sb.pod_name, uid=sb.pod_uid, namespace=sb.pod_namespace, attempt=sb.attempt)
    return pb.PodSandboxStats(attributes=pb.PodSandboxAttributes(id=sb.id, metadata=md, labels=sb.labels,
                                                                 annotations=sb.annotations), linux=linux)


async def _none() -> None:
    return None


async def pod_sandbox_stats(svc: Services, req: pb.PodSandboxStatsRequest) -> pb.PodSandboxStatsResponse:
    """PodSandboxStats returns the pod's cpu, memory, process count, network and its containers' stats."""
    sb = svc.store.get_sandbox(req.pod_sandbox_id)
    return pb.PodSandboxStatsResponse(stats=await sandbox_stats_of(svc, sb))


async def list_pod_sandbox_stats(svc: Services,
                                 req: pb.ListPodSandboxStatsRequest) -> pb.ListPodSandboxStatsResponse:
    """ListPodSandboxStats returns the stats of every ready sandbox matching the filter (id, labels)."""
    f = req.filter
    flt = SandboxFilter(id=f.id, label_selector=dict(f.label_selector)) if req.HasField("filter") \
        else SandboxFilter()
    sbs = [s for s in svc.store.list_sandboxes(flt) if s.state == SandboxState.READY]
    return pb.ListPodSandboxStatsResponse(stats=await asyncio.gather(*(sandbox_stats_of(svc, s) for s in sbs)))
