"""ContainerStats, ListContainerStats, PodSandboxStats, ListPodSandboxStats, and the sampling they share with
the CRI metrics RPCs (rpc/metrics.py).

A sample is one reading per object: CPU, memory and pids from each running task's cgroup files, read here
(rpc/cgread.py; the metrics RPCs, which also want block I/O, kernel memory and OOM counters, and any task whose
cgroup is not found that way ask the task's shim for its full cgroup metrics), the writable layer from the image
service (a walk of the container's upper dir, in a thread), network from the pod's namespace
(/proc/<pause>/net/dev), and for metrics process, thread and fd counts from /proc. This module turns samples into
CRI stats (CPU rate from the previous sample), metrics.py into CRI metrics. Containers that are not running
report only their writable layer. A shim or file that is gone leaves its part out (logged at debug); it never
fails the call.

kubelet asks for the same objects from several callers (ListPodSandboxStats and ListContainerStats back to
back, the summary API, eviction): concurrent callers share one shim call or walk, a cgroup or shim reading
younger than _READING_MAX_AGE_NS answers again (its own timestamp kept), and a writable layer is walked at
most once per _LAYER_MAX_AGE_NS (as containerd 1.6 walks snapshots every stats_collect_period; the FilesystemUsage
timestamp is the walk's).

A List*Stats call (and the metrics RPCs) never holds the event loop for long: objects are sampled
_STATS_SWEEP_CONCURRENCY (_SWEEP_CONCURRENCY) at a time (so the work handled in one loop iteration is small) and both the sampling
and the response's items go in slices of ~_SLICE_S of work, the loop running its other callbacks between two
slices (Pacer): a ListPodSandbox or ListContainers from kubelet's PLEG that arrives during a sweep of 100 pods
waits for a slice, not the sweep (it waited for all of it: 300 ms p99 at 100 pods on a loaded machine).
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Hashable, Iterable

from cri_server.api.v1 import api_pb2 as pb
from cri_server.context import Services
from cri_server.rpc import cgdecode, cgread
from cri_server.shims import ShimGone
from cri_server.store.records import ContainerFilter, ContainerRecord, ContainerState, SandboxFilter, \
    SandboxRecord, SandboxState
from runtime.cgroups.manager import working_set

log = logging.getLogger(__name__)

# Kernel memory limits this large mean "no limit".
_UNLIMITED = 1 << 62
# Two CPU samples closer than this give no new rate (the last one is reported again): kubelet's callers
# (eviction, summary, resource metrics) ask at their own pace, and a rate over a few ms is noise.
_MIN_RATE_WINDOW_NS = 1_000_000_000
# A shim reading this young answers again (below the rate window: no rate changes because of it).
_READING_MAX_AGE_NS = 500_000_000
# One walk of a writable layer per container at most this often, each call's bound drawn within +-20% so
# the layers of pods created together are not all walked again in one call.
_LAYER_MAX_AGE_NS = 10_000_000_000
# The most work a stats sweep does on the event loop before letting it run other callbacks (Pacer), and how
# long it then leaves the loop idle: a real sleep, not sleep(0), so that the GIL is free while the loop waits
# in epoll (the gRPC poller thread hands each request to the loop under the GIL; with the loop thread busy it
# waited up to the 5 ms switch interval per hand-off) and so that the loop thread sleeps in the kernel, which
# on a loaded machine gets it scheduled again sooner than a thread that used its whole time slice.
_SLICE_S = 0.001
_IDLE_S = 0.0002
# Objects sampled at once by one sweep: each has its shim call(s) in flight; their answers are what the loop
# handles between two of its iterations, so this bounds that work too (~0.15 ms an answer). The metrics RPCs
# ask every object's shim (round trips worth overlapping).
_SWEEP_CONCURRENCY = 8
# The stats RPCs read the counters from the cgroup files here (rpc/cgread.py; a shim only when they cannot be):
# nothing to overlap, and the continuations of several samples in flight ran back to back in one loop
# iteration, past the Pacer's slice. At 100 pods under kubelet-shaped relisting (scripts/bench/relist, one
# run each, 2026-12-02) the PLEG calls' p99 went from 25-27 ms with 8 to 10-12 ms with 1, the sweep as long.
_STATS_SWEEP_CONCURRENCY = 1


class Pacer:
    """A budget of work per event-loop iteration shared by the tasks of one sweep: `await pause()` before a
    piece of work returns at once while this iteration's pieces took less than `slice_s`, else sleeps
    _IDLE_S (the loop polls its I/O and runs the other ready callbacks meanwhile: a List RPC in between waits
    for one slice, not the sweep)."""

    def __init__(self, slice_s: float | None = None) -> None:
        self.slice_s = _SLICE_S if slice_s is None else slice_s
        self.yields = 0
        self._start = 0.0      # perf_counter at the first piece of this iteration; 0: none yet

    def _next_iteration(self) -> None:
        self._start = 0.0

    async def pause(self) -> None:
        while True:
            now = time.perf_counter()
            if not self._start:
                self._start = now
                # Runs at the start of the next iteration, before the continuations of the tasks parked below.
                asyncio.get_running_loop().call_soon(self._next_iteration)
                return
            if now - self._start < self.slice_s:
                return
            self.yields += 1
            await asyncio.sleep(_IDLE_S)


async def paced(items: Iterable[Any], convert: Callable[[Any], Any], pacer: Pacer | None = None) -> list[Any]:
    """[convert(x) for x in items], yielding to the event loop between slices (see Pacer)."""
    pacer = pacer or Pacer()
    out = []
    for x in items:
        await pacer.pause()
        out.append(convert(x))
    return out


async def sweep(items: list[Any], sample: Callable[[Any], Awaitable[Any]], pacer: Pacer,
                concurrency: int | None = None) -> list[Any]:
    """[await sample(x) for x in items] with at most `concurrency` (default _SWEEP_CONCURRENCY) in flight,
    paced (see Pacer); in order."""
    concurrency = concurrency or _SWEEP_CONCURRENCY
    out: list[Any] = [None] * len(items)
    todo = iter(enumerate(items))

    async def worker() -> None:
        for i, x in todo:
            await pacer.pause()
            out[i] = await sample(x)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(items)))))
    return out


class CpuRates:
    """The previous CPU sample per object, for usage_nano_cores (kubelet's summary API wants a rate)."""

    def __init__(self, min_window_ns: int = _MIN_RATE_WINDOW_NS) -> None:
        self._last: dict[str, tuple[int, int, int]] = {}
        self.min_window_ns = min_window_ns

    def rate(self, object_id: str, now_ns: int, total_ns: int) -> int:
        prev = self._last.get(object_id)
        if prev is not None and 0 <= now_ns - prev[0] < self.min_window_ns and total_ns >= prev[1]:
            return prev[2]
        # An object's first sample has no rate yet: 0, as containerd answers. Left unset, kubelet computes the
        # rate itself from two readings, and a reading served twice (the same timestamp) is "zero or negative
        # interval" in its log.
        rate = 0
        if prev is not None and now_ns > prev[0] and total_ns >= prev[1]:
            rate = (total_ns - prev[1]) * 1_000_000_000 // (now_ns - prev[0])
        self._last[object_id] = (now_ns, total_ns, rate)
        return rate

    def forget_missing(self, live: set[str]) -> None:
        for k in [k for k in self._last if k not in live]:
            del self._last[k]


_rates = CpuRates()


class Recent:
    """The last value fetched per key, and the fetch in flight: concurrent callers share one fetch (a caller
    that is cancelled does not cancel it), and a value younger than its max age answers again. A value is kept
    only for the same `version` (e.g. the shim address it was read from); failed fetches are not kept."""

    def __init__(self) -> None:
        self._values: dict[str, tuple[Hashable, int, Any]] = {}   # key -> (version, fetched (monotonic ns), value)
        self._pending: dict[tuple[str, Hashable], asyncio.Future[Any]] = {}

    async def get(self, key: str, version: Hashable, max_age_ns: int, fetch: Callable[[], Awaitable[Any]],
                  keep: Callable[[Any], bool] = lambda _v: True) -> Any:
        hit = self._values.get(key)
        if hit is not None and hit[0] == version and time.monotonic_ns() - hit[1] < max_age_ns:
            return hit[2]
        pending = self._pending.get((key, version))
        if pending is None:
            pending = asyncio.ensure_future(fetch())
            self._pending[(key, version)] = pending

            def done(f: asyncio.Future[Any]) -> None:
                self._pending.pop((key, version), None)
                if not f.cancelled() and f.exception() is None and keep(f.result()):
                    self._values[key] = (version, time.monotonic_ns(), f.result())
            pending.add_done_callback(done)
        return await asyncio.shield(pending)

    def forget_missing(self, live: set[str]) -> None:
        for k in [k for k in self._values if k not in live]:
            del self._values[k]

    def __len__(self) -> int:
        return len(self._values)


@dataclass
class Readings:
    """One daemon's recent shim readings (id -> (ns since the epoch, metrics)), writable-layer walks, and
    where each task's cgroup counters are with the last reading of them (rpc/cgread.py)."""
    metrics: Recent = field(default_factory=Recent)
    layers: Recent = field(default_factory=Recent)
    # id -> [pid, the cgroup manager or None (ask the shim), read at (monotonic ns), read at (epoch ns), reading]
    cgroups: dict[str, list[Any]] = field(default_factory=dict)

    def forget_missing(self, live: set[str]) -> None:
        self.metrics.forget_missing(live)
        self.layers.forget_missing(live)
        for k in [k for k in self.cgroups if k not in live]:
            del self.cgroups[k]


_readings: "weakref.WeakKeyDictionary[Any, Readings]" = weakref.WeakKeyDictionary()
_last: list[Any] = [None, None]     # the last (store, Readings) looked up: a daemon has one store


def readings(svc: Services) -> Readings:
    """The Readings of the daemon `svc` belongs to (one per metadata store)."""
    store = svc.store
    if _last[0] is store:
        return _last[1]
    r = _readings.get(store)
    if r is None:
        r = _readings[store] = Readings()
    _last[:] = [store, r]
    return r


def forget_gone(svc: Services) -> None:
    """Drops rates and readings of objects no longer in the store."""
    live = {r.id for r in svc.store.list_containers()} | {s.id for s in svc.store.list_sandboxes()}
    _rates.forget_missing(live)
    readings(svc).forget_missing(live)


def _u64(v: int | None) -> pb.UInt64Value | None:
    return None if v is None else pb.UInt64Value(value=max(int(v), 0))


def limited(v: int) -> bool:
    """A memory limit that is one (kernels write ~2^63 for none)."""
    return 0 < v < _UNLIMITED


# -- samples ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Interface:
    """One line of /proc/<pid>/net/dev."""
    name: str
    rx_bytes: int
    rx_packets: int
    rx_errors: int
    rx_dropped: int
    tx_bytes: int
    tx_packets: int
    tx_errors: int
    tx_dropped: int


@dataclass(frozen=True)
class Processes:
    count: int       # processes in the container's cgroup (cgroup.procs)
    threads: int     # its tasks: pids.current, else counted in /proc
    fds: int         # open file descriptors of those processes
    sockets: int = 0  # those of them that are sockets


@dataclass(frozen=True)
class Layer:
    mountpoint: str  # the filesystem of the writable layers (kubelet asks cAdvisor about it)
    bytes: int
    inodes: int
    at: int = 0      # ns since the epoch: when the walk ended


@dataclass
class ContainerSample:
    record: ContainerRecord
    now: int                       # ns since the epoch, right after the cgroup reading
    metrics: Any = None            # io.containerd.cgroups.v1.Metrics; None: not running or no answer
    layer: Layer | None = None
    processes: Processes | None = None


@dataclass
class PodSample:
    sandbox: SandboxRecord
    now: int
    pause: Any = None              # the pause container's cgroup metrics
    containers: list[ContainerSample] = field(default_factory=list)
    network: list[Interface] | None = None


async def _metrics(svc: Services, object_id: str, address: str, pid: int = 0) -> tuple[int, Any]:
    """(ns since the epoch when it was read, the cgroup metrics or None). With the task's `pid` (the stats
    RPCs): read here from its cgroup files (rpc/cgread.py), the shim asked only when they cannot be; without
    (the metrics RPCs, which want every counter): the shim's reading, a recent one if any."""
    if not address:
        return time.time_ns(), None
    if pid:
        reading = _cgroup_reading(svc, object_id, pid)
        if reading is not None:
            return reading
    return await readings(svc).metrics.get(object_id, address, _READING_MAX_AGE_NS,
                                           lambda: _read_metrics(svc, object_id, address),
                                           keep=lambda v: v[1] is not None)


def _cgroup_reading(svc: Services, object_id: str, pid: int) -> tuple[int, Any] | None:
    """(ns since the epoch, the task's counters) from its cgroup files, located once per pid; a reading
    younger than _READING_MAX_AGE_NS answers again (ListPodSandboxStats then ListContainerStats read each
    cgroup once). None: no cgroup of its own found or readable, ask its shim."""
    known = readings(svc).cgroups
    hit = known.get(object_id)
    if hit is None or hit[0] != pid:
        hit = known[object_id] = [pid, cgread.locate(pid, object_id), 0, 0, None]
    _pid, files, fetched, at, m = hit
    if files is None:
        return None
    now = time.monotonic_ns()
    if m is None or now - fetched >= _READING_MAX_AGE_NS:
        m = cgread.read(files)
        if m is None:
            return None
        hit[2:] = [now, time.time_ns(), m]
        at = hit[3]
    return at, m


async def _read_metrics(svc: Services, object_id: str, address: str) -> tuple[int, Any]:
    m = await _shim_metrics(svc, object_id, address)
    return time.time_ns(), m


async def _shim_metrics(svc: Services, object_id: str, address: str) -> Any:
    from shim import ttrpc_wire as w
    from shim.pb import cgroups_v1
    try:
        resp = await svc.need_shims().call(object_id, address, "Stats", timeout=10.0, id=object_id)
    except (ShimGone, w.TtrpcError) as e:
        log.debug("no stats", extra={"id": object_id, "error": str(e)})
        return None
    if resp.stats is None or not resp.stats.value:
        return None
    try:
        return cgdecode.decode(cgroups_v1.Metrics, resp.stats.value)     # in C: see rpc/cgdecode.py
    except ValueError as e:          # not an io.containerd.cgroups.v1.Metrics
        log.debug("undecodable stats", extra={"id": object_id, "type_url": resp.stats.type_url, "error": str(e)})
        return None


async def _no_reading() -> tuple[int, Any]:
    return time.time_ns(), None


async def layer_usage(svc: Services, container_id: str) -> Layer | None:
    """The container's writable-layer usage: a walk younger than _LAYER_MAX_AGE_NS (+-20%), else a new one."""
    if svc.images is None:
        return None
    max_age = int(_LAYER_MAX_AGE_NS * random.uniform(0.8, 1.2))
    return await readings(svc).layers.get(container_id, "", max_age, lambda: _walk_layer(svc, container_id),
                                          keep=lambda v: v is not None)


async def _walk_layer(svc: Services, container_id: str) -> Layer | None:
    images = svc.images
    if images is None:
        return None
    try:
        u = await asyncio.to_thread(images.usage, container_id)
    except Exception as e:  # noqa: BLE001 -- a snapshot that vanished has no usage; never fail the stats call
        log.debug("no writable layer usage", extra={"id": container_id, "error": str(e)})
        return None
    return Layer(images.snapshots.active_dir, u.bytes, u.inodes, time.time_ns())


def process_counts(pid: int, tasks: int | None) -> Processes | None:
    """Processes, threads, open fds and sockets of the cgroup `pid` is in (cAdvisor's container_processes,
    container_threads, container_file_descriptors, container_sockets). `tasks`: pids.current when the shim
    read it."""
    from shim import cgroup_watch
    try:
        pids = cgroup_watch.pids(cgroup_watch.cgroup_of(pid))
    except (OSError, ValueError) as e:
        log.debug("no process counts", extra={"pid": pid, "error": str(e)})
        return None
    if not pids:
        return None
    fds, sockets = _fds_and_sockets(pids)
    return Processes(count=len(pids), threads=tasks or _count_entries(pids, "task"), fds=fds, sockets=sockets)


def _fds_and_sockets(pids: list[int]) -> tuple[int, int]:
    fds = sockets = 0
    for p in pids:
        d = f"/proc/{p}/fd"
        try:
            names = os.listdir(d)
        except OSError:
            continue                  # exited meanwhile
        fds += len(names)
        for n in names:
            try:
                sockets += os.readlink(f"{d}/{n}").startswith("socket:")
            except OSError:
                continue              # closed meanwhile
    return fds, sockets


def _count_entries(pids: list[int], sub: str) -> int:
    n = 0
    for p in pids:
        try:
            n += len(os.listdir(f"/proc/{p}/{sub}"))
        except OSError:
            continue                  # exited meanwhile
    return n


async def sample_container(svc: Services, r: ContainerRecord, processes: bool = False) -> ContainerSample:
    running = r.state == ContainerState.RUNNING
    now, m = await _metrics(svc, r.id, r.shim_address, 0 if processes else r.pid) if running \
        else (time.time_ns(), None)
    s = ContainerSample(record=r, now=now, metrics=m)
    s.layer = await layer_usage(svc, r.id)
    if processes and m is not None and r.pid:
        tasks = m.pids.current if m.pids is not None and m.pids.current else None
        s.processes = await asyncio.to_thread(process_counts, r.pid, tasks)
    return s


def read_net_dev(pid: int) -> list[Interface] | None:
    """Interface counters of the network namespace `pid` lives in, without lo."""
    try:
        with open(f"/proc/{pid}/net/dev") as f:
            lines = f.readlines()[2:]
    except OSError as e:
        log.debug("no network counters", extra={"pid": pid, "error": str(e)})
        return None
    out = []
    for line in lines:
        name, _, rest = line.partition(":")
        name = name.strip()
        v = rest.split()
        if name == "lo" or len(v) < 16 or not all(x.isdigit() for x in v[:16]):
            continue
        # receive: bytes packets errs drop fifo frame compressed multicast; transmit: bytes packets errs drop ...
        n = [int(x) for x in v[:16]]
        out.append(Interface(name, rx_bytes=n[0], rx_packets=n[1], rx_errors=n[2], rx_dropped=n[3],
                             tx_bytes=n[8], tx_packets=n[9], tx_errors=n[10], tx_dropped=n[11]))
    return out


async def sample_pod(svc: Services, sb: SandboxRecord, processes: bool = False) -> PodSample:
    ready = sb.state == SandboxState.READY
    containers = [c for c in svc.store.containers_of(sb.id) if not c.extra.get("creating")]
    (at, pause), *samples = await asyncio.gather(
        _metrics(svc, sb.id, sb.shim_address, 0 if processes else sb.pid) if ready else _no_reading(),
        *(sample_container(svc, c, processes) for c in containers))
    net = read_net_dev(sb.pid) if ready and sb.netns_path and sb.pid else None
    # The pod's figures are sums of these readings: they carry the newest one's time (a reading reused from a
    # moment ago keeps its own, so the pod's CPU rate spans the window its numbers do).
    times = [at] if pause is not None else []
    times += [c.now for c in samples if c.metrics is not None]
    return PodSample(sandbox=sb, now=max(times) if times else time.time_ns(), pause=pause,
                     containers=list(samples), network=net)


# -- memory figures (stats and metrics) -------------------------------------------------------------------

@dataclass(frozen=True)
class Memory:
    """What kubelet and cAdvisor derive from a cgroup's memory counters (v1 names; the shim maps v2 onto
    them). limit is 0 when there is none, swap_limit None; swap is None without swap accounting."""
    usage: int
    working_set: int
    limit: int
    rss: int
    cache: int
    mapped_file: int
    page_faults: int
    major_page_faults: int
    failcnt: int
    max_usage: int
    swap: int | None
    swap_limit: int | None
    kernel: int | None = None     # kernel memory (v1 memory.kmem, v2 memory.stat's kernel); None: not read

    @property
    def available(self) -> int | None:
        return self.limit - self.working_set if self.limit > self.working_set else None

    @property
    def swap_available(self) -> int | None:
        if self.swap is None or self.swap_limit is None:
            return None
        return max(self.swap_limit - self.swap, 0)


def memory_of(m: Any) -> Memory | None:
    mem = m.memory if m is not None else None
    if mem is None:
        return None
    e = mem.usage
    usage = e.usage if e is not None else 0
    inactive = mem.total_inactive_file or mem.inactive_file
    limit = e.limit if e is not None and limited(e.limit) else 0
    swap = swap_limit = None
    if mem.swap is not None and mem.swap.usage:
        # v1's memsw counts memory + swap (the shim reports v2 the same way).
        swap = max(mem.swap.usage - usage, 0)
        swap_limit = max(mem.swap.limit - limit, 0) if limit and limited(mem.swap.limit) else None
    return Memory(usage=usage, working_set=working_set(usage, inactive), limit=limit,
                  rss=mem.total_rss or mem.rss, cache=mem.total_cache or mem.cache,
                  mapped_file=mem.total_mapped_file or mem.mapped_file,
                  page_faults=mem.total_pg_fault or mem.pg_fault,
                  major_page_faults=mem.total_pg_maj_fault or mem.pg_maj_fault,
                  failcnt=e.failcnt if e is not None else 0, max_usage=e.max if e is not None else 0,
                  swap=swap, swap_limit=swap_limit, kernel=mem.kernel.usage if mem.kernel is not None else None)


# -- samples to CRI stats ---------------------------------------------------------------------------------

def cpu_usage(object_id: str, m: Any, now: int) -> pb.CpuUsage:
    total = m.cpu.usage.total if m is not None and m.cpu is not None and m.cpu.usage is not None else 0
    # No reading (the shim did not answer) must not become a sample, or the next rate would be the whole total.
    return pb.CpuUsage(timestamp=now, usage_core_nano_seconds=_u64(total),
                       usage_nano_cores=_u64(_rates.rate(object_id, now, total) if total else None))


def memory_usage(m: Any, now: int) -> pb.MemoryUsage:
    f = memory_of(m)
    if f is None:
        return pb.MemoryUsage(timestamp=now, working_set_bytes=_u64(0), usage_bytes=_u64(0))
    return pb.MemoryUsage(timestamp=now, working_set_bytes=_u64(f.working_set), usage_bytes=_u64(f.usage),
                          available_bytes=_u64(f.available), rss_bytes=_u64(f.rss),
                          page_faults=_u64(f.page_faults), major_page_faults=_u64(f.major_page_faults))


def swap_usage(m: Any, now: int) -> pb.SwapUsage | None:
    f = memory_of(m)
    if f is None or f.swap is None:
        return None
    return pb.SwapUsage(timestamp=now, swap_usage_bytes=_u64(f.swap), swap_available_bytes=_u64(f.swap_available))


def container_stats_from(s: ContainerSample) -> pb.ContainerStats:
    r = s.record
    st = pb.ContainerStats(attributes=pb.ContainerAttributes(
        id=r.id, metadata=pb.ContainerMetadata(name=r.container_name, attempt=r.attempt),
        labels=r.labels, annotations=r.annotations))
    if r.state == ContainerState.RUNNING:
        st.cpu.CopyFrom(cpu_usage(r.id, s.metrics, s.now))
        st.memory.CopyFrom(memory_usage(s.metrics, s.now))
        swap = swap_usage(s.metrics, s.now)
        if swap is not None:
            st.swap.CopyFrom(swap)
    if s.layer is not None:
        st.writable_layer.CopyFrom(pb.FilesystemUsage(
            timestamp=s.layer.at or s.now, fs_id=pb.FilesystemIdentifier(mountpoint=s.layer.mountpoint),
            used_bytes=_u64(s.layer.bytes), inodes_used=_u64(s.layer.inodes)))
    return st


async def container_stats(svc: Services, req: pb.ContainerStatsRequest) -> pb.ContainerStatsResponse:
    """ContainerStats returns cpu, memory, swap and writable-layer usage of one container; NotFound if unknown."""
    r = svc.store.get_container(req.container_id)
    return pb.ContainerStatsResponse(stats=container_stats_from(await sample_container(svc, r)))


async def list_container_stats(svc: Services, req: pb.ListContainerStatsRequest) -> pb.ListContainerStatsResponse:
    """ListContainerStats returns the stats of every container matching the filter (id, pod, labels)."""
    f = req.filter
    flt = ContainerFilter(id=f.id, sandbox_id=f.pod_sandbox_id, label_selector=dict(f.label_selector)) \
        if req.HasField("filter") else ContainerFilter()
    recs = [r for r in svc.store.list_containers(flt) if not r.extra.get("creating")]
    pacer = Pacer()
    samples = await sweep(recs, lambda r: sample_container(svc, r), pacer, _STATS_SWEEP_CONCURRENCY)
    forget_gone(svc)
    return pb.ListContainerStatsResponse(stats=await paced(samples, container_stats_from, pacer))


def network_from(ifaces: list[Interface], now: int) -> pb.NetworkUsage:
    """eth0 is the pod's default interface (CNI's name for it); every interface is listed."""
    out = pb.NetworkUsage(timestamp=now)
    for i in ifaces:
        iface = pb.NetworkInterfaceUsage(name=i.name, rx_bytes=_u64(i.rx_bytes), rx_errors=_u64(i.rx_errors),
                                         tx_bytes=_u64(i.tx_bytes), tx_errors=_u64(i.tx_errors))
        if i.name == "eth0":
            out.default_interface.CopyFrom(iface)
        out.interfaces.append(iface)
    return out


def network_usage(pid: int, now: int) -> pb.NetworkUsage | None:
    """Interface counters of the namespace `pid` lives in."""
    ifaces = read_net_dev(pid)
    return None if ifaces is None else network_from(ifaces, now)


def sandbox_stats_from(p: PodSample) -> pb.PodSandboxStats:
    sb, now = p.sandbox, p.now
    linux = pb.LinuxPodSandboxStats()
    linux.containers.extend(container_stats_from(c) for c in p.containers)
    # The pod's usage: the pause container plus every running container (each has its own cgroup).
    total_cpu = count = 0
    mem = dict.fromkeys(("usage", "working_set", "rss", "page_faults", "major_page_faults"), 0)
    available: int | None = 0
    for m, is_pause in [(p.pause, True), *((c.metrics, False) for c in p.containers)]:
        if m is None:
            continue
        if m.cpu is not None and m.cpu.usage is not None:
            total_cpu += m.cpu.usage.total
        f = memory_of(m)
        if f is not None:
            for k in mem:
                mem[k] += getattr(f, k)
            if not is_pause:      # the pod has headroom left only if every container has a limit
                available = None if available is None or f.available is None else available + f.available
        if m.pids is not None:
            count += m.pids.current
    linux.cpu.CopyFrom(pb.CpuUsage(timestamp=now, usage_core_nano_seconds=_u64(total_cpu),
                                   usage_nano_cores=_u64(_rates.rate(sb.id, now, total_cpu) if total_cpu
                                                         else None)))
    has_containers = any(c.metrics is not None and c.metrics.memory is not None for c in p.containers)
    linux.memory.CopyFrom(pb.MemoryUsage(
        timestamp=now, working_set_bytes=_u64(mem["working_set"]), usage_bytes=_u64(mem["usage"]),
        rss_bytes=_u64(mem["rss"]), page_faults=_u64(mem["page_faults"]),
        major_page_faults=_u64(mem["major_page_faults"]), available_bytes=_u64(available if has_containers
                                                                                else None)))
    linux.process.CopyFrom(pb.ProcessUsage(timestamp=now, process_count=_u64(count)))
    if p.network is not None:
        linux.network.CopyFrom(network_from(p.network, now))
    md = pb.PodSandboxMetadata(name=sb.pod_name, uid=sb.pod_uid, namespace=sb.pod_namespace, attempt=sb.attempt)
    return pb.PodSandboxStats(attributes=pb.PodSandboxAttributes(id=sb.id, metadata=md, labels=sb.labels,
                                                                 annotations=sb.annotations), linux=linux)


async def pod_sandbox_stats(svc: Services, req: pb.PodSandboxStatsRequest) -> pb.PodSandboxStatsResponse:
    """PodSandboxStats returns the pod's cpu, memory, process count, network and its containers' stats."""
    sb = svc.store.get_sandbox(req.pod_sandbox_id)
    return pb.PodSandboxStatsResponse(stats=sandbox_stats_from(await sample_pod(svc, sb)))


def ready_sandboxes(svc: Services, flt: SandboxFilter | None = None) -> list[SandboxRecord]:
    return [s for s in svc.store.list_sandboxes(flt or SandboxFilter()) if s.state == SandboxState.READY]


async def list_pod_sandbox_stats(svc: Services,
                                 req: pb.ListPodSandboxStatsRequest) -> pb.ListPodSandboxStatsResponse:
    """ListPodSandboxStats returns the stats of every ready sandbox matching the filter (id, labels)."""
    f = req.filter
    flt = SandboxFilter(id=f.id, label_selector=dict(f.label_selector)) if req.HasField("filter") \
        else SandboxFilter()
    pacer = Pacer()
    samples = await sweep(ready_sandboxes(svc, flt), lambda sb: sample_pod(svc, sb), pacer,
                          _STATS_SWEEP_CONCURRENCY)
    forget_gone(svc)
    return pb.ListPodSandboxStatsResponse(stats=await paced(samples, sandbox_stats_from, pacer))
