"""The cgroup manager interface and the stats record shared by the v1 and v2 managers.

The runtime and the shim only ever call this interface (husk-cri gets the shim's metrics); cgroup files are
touched only by v1.py and v2.py. `runtime.cgroups.manager_for(path)` picks the implementation the host has,
`runtime.cgroups.manager_of_pid(pid)` the one of the cgroup a process is in.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


def working_set(usage: int, inactive_file: int) -> int:
    """Memory usage minus inactive file pages (the kernel can drop those), never below 0: kubelet's and
    cAdvisor's working set, from which evictions are decided."""
    return usage - inactive_file if usage > inactive_file else 0


@dataclass
class CpuStats:
    usage_ns: int = 0          # total CPU time used (cpuacct.usage / cpu.stat usage_usec * 1000)
    user_ns: int = 0
    system_ns: int = 0
    nr_periods: int = 0
    nr_throttled: int = 0
    throttled_ns: int = 0
    percpu_ns: list[int] = field(default_factory=list)         # v1 only (cpuacct.usage_percpu)
    percpu_user_ns: list[int] = field(default_factory=list)    # v1 only (cpuacct.usage_all)
    percpu_system_ns: list[int] = field(default_factory=list)


@dataclass
class MemoryEntry:
    """One memory counter as the kernel reports it (runc's MemoryData): v1 <prefix>.usage_in_bytes,
    .max_usage_in_bytes, .limit_in_bytes (a huge number when unlimited), .failcnt; v2 memory[.swap].current,
    .peak, .max (2**64-1 for "max")."""
    usage: int = 0
    max_usage: int = 0
    limit: int = 0
    failcnt: int = 0


@dataclass
class MemoryStats:
    usage: int = 0             # memory.usage_in_bytes / memory.current
    limit: int = 0             # 0 = unlimited
    max_usage: int = 0         # v1 only (memory.max_usage_in_bytes)
    working_set: int = 0       # usage minus inactive file pages, as kubelet computes it
    rss: int = 0               # anon memory
    cache: int = 0             # page cache (file)
    swap_usage: int = 0
    oom_events: int = 0        # times the limit was hit (v1 failcnt-based / v2 memory.events oom)
    oom_kills: int = 0         # processes killed by the OOM killer in this cgroup (memory.events oom_kill)
    oom_kill_disable: int = 0  # v1 only (memory.oom_control)
    under_oom: int = 0         # v1 only (memory.oom_control)
    kernel: int = 0            # kernel memory: v1 memory.kmem.usage_in_bytes, v2 memory.stat's kernel (or parts)
    raw: dict[str, int] = field(default_factory=dict)  # memory.stat as read
    # "usage", "swap" (memory+swap, as v1 counts it), "kernel", "kernelTCP": the counters runc's events shows
    entries: dict[str, MemoryEntry] = field(default_factory=dict)


@dataclass
class PidsStats:
    current: int = 0
    limit: int = 0             # 0 = unlimited


@dataclass(frozen=True)
class BlkioEntry:
    major: int
    minor: int
    op: str        # "Read", "Write", "Sync", "Async", "Discard", "Total" as the kernel names them
    value: int


@dataclass
class IoStats:
    read_bytes: int = 0
    write_bytes: int = 0
    read_ios: int = 0
    write_ios: int = 0
    # per device, by runc's names ("ioServiceBytesRecursive", "ioServicedRecursive", ...)
    entries: dict[str, list[BlkioEntry]] = field(default_factory=dict)
    # v1 only: blkio.throttle.io_service_bytes_recursive / io_serviced_recursive per device (filled whatever
    # the I/O scheduler, where `entries` follows runc's order and may hold BFQ's or CFQ's counters)
    throttle: dict[str, list[BlkioEntry]] = field(default_factory=dict)


@dataclass
class CpusetStats:
    """v1 cpuset files (runc's CPUSetStats); empty on v2."""
    cpus: list[int] = field(default_factory=list)
    mems: list[int] = field(default_factory=list)
    flags: dict[str, int] = field(default_factory=dict)   # cpu_exclusive, mem_hardwall, ... as runc names them


@dataclass
class HugetlbStats:
    usage: int = 0
    max_usage: int = 0
    failcnt: int = 0


@dataclass
class Stats:
    """One structure for v1 and v2, filled as far as the host's controllers allow."""
    cpu: CpuStats = field(default_factory=CpuStats)
    memory: MemoryStats = field(default_factory=MemoryStats)
    pids: PidsStats = field(default_factory=PidsStats)
    io: IoStats = field(default_factory=IoStats)
    hugetlb: dict[str, HugetlbStats] = field(default_factory=dict)   # page size ("2MB") -> stats
    cpuset: CpusetStats = field(default_factory=CpusetStats)


class Manager(Protocol):
    """One container's cgroup (or, for v1, its directory in each controller hierarchy).

    `resources` is the OCI `linux.resources` object as a dict (the JSON of config.json);
    each method raises runtime.errors.SetupError naming the file and the reason on failure.
    """

    path: str  # the cgroupsPath as resolved (absolute within the hierarchy, e.g. "/husk/abc")
    version: int  # 1 (v1 or hybrid hierarchies) or 2 (unified)

    def create(self) -> None:
        """Creates the cgroup (and, on v2, enables the needed controllers in every ancestor)."""

    def apply(self, pid: int) -> None:
        """Moves `pid` into the cgroup."""

    def set(self, resources: dict[str, Any]) -> None:
        """Writes every limit given in `resources`; fields that are absent are left alone."""

    def stats(self, basic: bool = False) -> Stats:
        """The cgroup's counters. `basic`: only CPU usage, memory usage/limit/memory.stat and memory+swap, and
        pids.current (what the CRI stats RPCs read: 6-8 files instead of ~45), SetupError if it is gone."""

    def pids(self) -> list[int]:
        """Every pid in the cgroup (recursively on v2 / v1 with children)."""

    def freeze(self) -> None:
        """Freezes every process; returns once the kernel reports the cgroup frozen."""

    def thaw(self) -> None:
        ...

    def frozen(self) -> bool:
        ...

    def kill_all(self, sig: int) -> None:
        """Sends `sig` to every process in the cgroup (cgroup.kill on v2 when sig is SIGKILL)."""

    def oom_event_fd(self) -> int | None:
        """A non-blocking file descriptor that becomes readable when an OOM event occurs (v1: eventfd registered
        on memory.oom_control, also readable when the cgroup is removed; v2: an inotify fd on memory.events,
        IN_IGNORED when it is removed), or None if the cgroup has no memory controller. The caller drains it
        (os.read) and compares oom_kills() with the count it saw before."""

    def oom_kills(self) -> int | None:
        """The cgroup's OOM kill count (v1 memory.oom_control, v2 memory.events oom_kill: hierarchical), 0
        without a memory controller, None when the cgroup is gone."""

    def destroy(self) -> None:
        """Removes the cgroup directories (processes must be gone); a cgroup already gone is not an error."""

    def exists(self) -> bool:
        ...
