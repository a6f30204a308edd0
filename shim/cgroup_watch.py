"""The container's cgroup as the shim sees it: the runtime's cgroup manager of the init's cgroup, its pids,
stats for the task API (runtime.cgroups Stats mapped onto io.containerd.cgroups.v1.Metrics), OOM events.

Every cgroup file is read by runtime/cgroups (v1.py, v2.py); this module only maps and watches. The cgroup is
resolved from /proc/<init pid>/cgroup (runtime.cgroups.manager_of_pid), so it works whichever runtime made
it. OOM: the manager's oom_event_fd() in the shim's loop (v1: eventfd on memory.oom_control; v2: inotify on
memory.events), then its oom_kills() counter. runtime/ is imported lazily: the daemon path stays light.
"""
from __future__ import annotations

import os

from shim.pb import cgroups_v1
from shim.log import get as get_logger

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runtime.cgroups.manager import BlkioEntry, Manager, MemoryEntry, Stats

log = get_logger(__name__)

UNLIMITED = 2**64 - 1   # runtime.cgroups.v2's "max"; the Metrics message has 0 for no limit


def cgroup_of(pid: int) -> Manager:
    """The runtime's manager of the cgroup `pid` is in (OSError when the process is gone, ValueError when
    /proc/<pid>/cgroup names none)."""
    from runtime.cgroups import manager_of_pid
    return manager_of_pid(pid)


def pids(cg: Manager) -> list[int]:
    """Every process in the cgroup and its sub-cgroups, sorted."""
    return sorted(set(cg.pids()))


def paused(cg: Manager) -> bool | None:
    """The freezer's state: v1 freezer.state FROZEN or FREEZING, v2 cgroup.freeze 1; None when unreadable."""
    if cg.version == 2:
        name = os.path.join(cg.dir, "cgroup.freeze")  # type: ignore[attr-defined]
        want = ("1",)
    else:
        d = cg.dir("freezer")  # type: ignore[attr-defined]
        if d is None:
            return None
        name, want = os.path.join(d, "freezer.state"), ("FROZEN", "FREEZING")
    try:
        with open(name) as f:
            return f.read().strip() in want
    except OSError:
        return None


def metrics(cg: Manager) -> cgroups_v1.Metrics:
    """The cgroup's stats as io.containerd.cgroups.v1.Metrics; empty when the cgroup cannot be read (gone)."""
    from runtime.errors import HuskError
    try:
        st = cg.stats()
    except (OSError, ValueError, HuskError) as err:
        log.debug("cgroup %s: no stats: %s", cg.path, err)
        return cgroups_v1.Metrics()
    return to_metrics(st, cg.version)


def to_metrics(st: Stats, version: int) -> cgroups_v1.Metrics:
    """Maps runtime.cgroups Stats onto the v1 Metrics message: v1 fields as the kernel names them, v2 onto
    their v1 equivalents (memory.stat anon/file -> rss/cache, memory+swap as v1's memsw, io.stat -> blkio)."""
    m = cgroups_v1.Metrics()
    mem = st.memory
    if version == 1:
        if mem.entries or mem.raw:               # a memory cgroup was read
            ms = cgroups_v1.MemoryStat(**{field: mem.raw.get(k, 0) for k, field in _V1_MEMSTAT_FIELDS.items()})
            ms.usage = _entry(mem.entries.get("usage"))
            if "swap" in mem.entries:
                ms.swap = _entry(mem.entries["swap"])      # memory + swap, as v1 counts it
            if "kernel" in mem.entries:
                ms.kernel = _entry(mem.entries["kernel"])  # kernel memory (cAdvisor's KernelUsage)
            m.memory = ms
            m.memory_oom_control = cgroups_v1.MemoryOomControl(oom_kill_disable=mem.oom_kill_disable,
                                                               under_oom=mem.under_oom, oom_kill=mem.oom_kills)
    elif "usage" in mem.entries:                # memory.current was read
        r = mem.raw
        m.memory = cgroups_v1.MemoryStat(
            cache=r.get("file", 0), rss=r.get("anon", 0), mapped_file=r.get("file_mapped", 0),
            dirty=r.get("file_dirty", 0), writeback=r.get("file_writeback", 0),
            pg_fault=r.get("pgfault", 0), pg_maj_fault=r.get("pgmajfault", 0),
            inactive_anon=r.get("inactive_anon", 0), active_anon=r.get("active_anon", 0),
            inactive_file=r.get("inactive_file", 0), active_file=r.get("active_file", 0),
            unevictable=r.get("unevictable", 0), total_inactive_file=r.get("inactive_file", 0),
            usage=_entry(mem.entries["usage"]),
            kernel=cgroups_v1.MemoryEntry(usage=mem.kernel))
        if "swap" in mem.entries:
            m.memory.swap = _entry(mem.entries["swap"])     # memory + swap, as runc reports v2
        m.memory_oom_control = cgroups_v1.MemoryOomControl(oom_kill=mem.oom_kills)
    cpu = st.cpu
    m.cpu = cgroups_v1.CPUStat(
        usage=cgroups_v1.CPUUsage(total=cpu.usage_ns, per_cpu=list(cpu.percpu_ns), user=cpu.user_ns,
                                  kernel=cpu.system_ns),
        throttling=cgroups_v1.Throttle(periods=cpu.nr_periods, throttled_periods=cpu.nr_throttled,
                                       throttled_time=cpu.throttled_ns))
    if version == 1:
        # blkio.throttle.*_recursive: filled whatever the I/O scheduler
        if st.io.throttle:
            m.blkio = cgroups_v1.BlkIOStat(
                io_service_bytes_recursive=_blkio(st.io.throttle.get("ioServiceBytesRecursive", ())),
                io_serviced_recursive=_blkio(st.io.throttle.get("ioServicedRecursive", ())))
    else:
        rw = ("Read", "Write")
        m.blkio = cgroups_v1.BlkIOStat(
            io_service_bytes_recursive=_blkio(st.io.entries.get("ioServiceBytesRecursive", ()), rw),
            io_serviced_recursive=_blkio(st.io.entries.get("ioServicedRecursive", ()), rw))
    m.pids = cgroups_v1.PidsStat(current=st.pids.current, limit=st.pids.limit)
    return m


def _entry(e: MemoryEntry | None) -> cgroups_v1.MemoryEntry:
    if e is None:
        return cgroups_v1.MemoryEntry()
    return cgroups_v1.MemoryEntry(limit=0 if e.limit == UNLIMITED else e.limit, usage=e.usage, max=e.max_usage,
                                  failcnt=e.failcnt)


def _blkio(entries, ops: tuple[str, ...] = ()) -> list:  # entries: Iterable[BlkioEntry]
    return [cgroups_v1.BlkIOEntry(op=e.op, major=e.major, minor=e.minor, value=e.value)
            for e in entries if not ops or e.op in ops]


_V1_MEMSTAT = ("cache", "rss", "rss_huge", "mapped_file", "dirty", "writeback", "pgpgin", "pgpgout",
               "pgfault", "pgmajfault", "inactive_anon", "active_anon", "inactive_file", "active_file",
               "unevictable", "hierarchical_memory_limit", "hierarchical_memsw_limit", "total_cache",
               "total_rss", "total_rss_huge", "total_mapped_file", "total_dirty", "total_writeback",
               "total_pgpgin", "total_pgpgout", "total_pgfault", "total_pgmajfault", "total_inactive_anon",
               "total_active_anon", "total_inactive_file", "total_active_file", "total_unevictable")
# memory.stat's names differ from the message's for a few fields.
_RENAME = {"pgpgin": "pg_pg_in", "pgpgout": "pg_pg_out", "pgfault": "pg_fault", "pgmajfault": "pg_maj_fault",
           "hierarchical_memsw_limit": "hierarchical_swap_limit", "total_pgpgin": "total_pg_pg_in",
           "total_pgpgout": "total_pg_pg_out", "total_pgfault": "total_pg_fault",
           "total_pgmajfault": "total_pg_maj_fault"}
_V1_MEMSTAT_FIELDS = {k: _RENAME.get(k, k) for k in _V1_MEMSTAT}


class OomWatcher:
    """Calls `on_oom()` each time the cgroup's oom_kill counter rises: woken by the manager's oom_event_fd()
    (v1 eventfd, v2 inotify on memory.events), and checked once more at the init's exit (check())."""

    def __init__(self, loop, cg: Manager, on_oom) -> None:  # loop: shim.loop.Loop
        self.loop = loop
        self.cg = cg
        self.on_oom = on_oom
        self.fd = -1
        # v2: the parent's memory.events counts this cgroup's kills too. systemd removes a scope's cgroup as soon
        # as its last process is gone, which can be before the shim reads the counter at the init's exit; the
        # parent (the pod's slice) stays, so its count, read before ours at every check, tells a kill we missed.
        self.parent: Manager | None = None
        if cg.version == 2 and os.path.dirname(cg.path) != "/":
            from runtime.cgroups.v2 import V2Manager
            self.parent = V2Manager(os.path.dirname(cg.path), cg.mountpoint)  # type: ignore[attr-defined]
        self.parent_count = self.parent.oom_kills() if self.parent is not None else None
        self.count = cg.oom_kills() or 0
        from runtime.errors import HuskError
        try:
            fd = cg.oom_event_fd()
        except (OSError, HuskError) as err:
            log.warning("OOM events unavailable for %s: %s", cg.path, err)
            return
        if fd is not None:
            self.fd = fd
            loop.add_reader(fd, self._on_event)

    def _on_event(self) -> None:
        try:
            os.read(self.fd, 65536)      # v1: the eventfd's counter; v2: the inotify records
        except BlockingIOError:
            return
        except OSError:
            self.close()
            return
        self.check()
        if not self.cg.exists():
            self.close()         # v1: the eventfd also fires when the cgroup is removed; v2: IN_IGNORED

    def check(self) -> bool:
        """Re-reads the counter (also called at exit, as the last kill may race the event)."""
        if self.parent is not None:
            return self._check_v2()
        n = self.cg.oom_kills()
        if n is not None and n > self.count:
            self.count = n
            self.on_oom()
            return True
        return False

    def _check_v2(self) -> bool:
        assert self.parent is not None
        parent = self.parent.oom_kills()       # before ours: a kill counted in ours after this is in it too
        n = self.cg.oom_kills()
        if n is None:
            # Our cgroup is gone (systemd removed the emptied scope): a rise of the parent's count since our
            # last reading is a kill in our cgroup, unless a sibling was killed in the same moment.
            if parent is None or self.parent_count is None or parent <= self.parent_count:
                return False
            self.parent_count = parent
            self.on_oom()
            return True
        self.parent_count = parent
        if n > self.count:
            self.count = n
            self.on_oom()
            return True
        return False

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove(self.fd)
            os.close(self.fd)
            self.fd = -1
