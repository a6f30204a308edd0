"""The container's cgroup as the shim sees it: where it is, its pids, stats for the task API, OOM events.

Resolved from /proc/<init pid>/cgroup, so it works whichever runtime made the cgroup. Only reads files
(plus the v1 eventfd registration); limits are the runtime's business.
v1: OOM through an eventfd on memory.oom_control; v2: memory.events polled once a second (no inotify in
the stdlib, and the shim has no libc binding for it).
"""
from __future__ import annotations

import os

from shim.pb import cgroups_v1
from shim.record import Record
from shim.log import get as get_logger

log = get_logger(__name__)

CGROUP_ROOT = "/sys/fs/cgroup"
USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class CgroupPaths(Record):
    """v1: controller -> directory; v2: the unified directory, if it has controllers."""
    __slots__ = ("v1", "v2")
    FIELDS = (("v1", {}), ("v2", None))

    def dir_for(self, controller: str) -> str | None:
        if controller in self.v1:
            return self.v1[controller]
        return self.v2


def paths_of(pid: int) -> CgroupPaths:
    paths = CgroupPaths()
    pure_v2 = os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers"))
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            hid, controllers, path = line.rstrip("\n").split(":", 2)
            if hid == "0" and controllers == "":
                base = CGROUP_ROOT if pure_v2 else os.path.join(CGROUP_ROOT, "unified")
                d = os.path.join(base, path.lstrip("/"))
                if os.path.exists(os.path.join(d, "memory.current")) or pure_v2:
                    paths.v2 = d
                continue
            mount = os.path.join(CGROUP_ROOT, controllers)
            if not os.path.isdir(mount):
                continue
            for c in controllers.split(","):
                paths.v1[c] = os.path.join(mount, path.lstrip("/"))
    return paths


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _int(path: str) -> int:
    s = _read(path)
    if s is None:
        return 0
    s = s.strip()
    if s == "max":
        return 0
    try:
        return int(s)
    except ValueError:
        return 0


def _kv(path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    s = _read(path)
    for line in (s or "").splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def pids(paths: CgroupPaths) -> list[int]:
    d = paths.dir_for("pids") or paths.dir_for("memory") or paths.dir_for("cpu")
    if d is None:
        return []
    out: list[int] = []
    for name in ("cgroup.procs",):
        s = _read(os.path.join(d, name))
        out += [int(x) for x in (s or "").split()]
    return sorted(set(out))


def metrics(paths: CgroupPaths) -> cgroups_v1.Metrics:
    """io.containerd.cgroups.v1.Metrics filled from the v1 files, or the v2 equivalents on a v2 host."""
    m = cgroups_v1.Metrics()
    mem = paths.v1.get("memory")
    if mem:
        st = _kv(os.path.join(mem, "memory.stat"))
        ms = cgroups_v1.MemoryStat(**{_V1_MEMSTAT_FIELDS[k]: st.get(k, 0) for k in _V1_MEMSTAT})
        ms.usage = _v1_entry(os.path.join(mem, "memory."))
        if os.path.exists(os.path.join(mem, "memory.memsw.usage_in_bytes")):
            ms.swap = _v1_entry(os.path.join(mem, "memory.memsw."))   # memory + swap, as on v1
        if os.path.exists(os.path.join(mem, "memory.kmem.usage_in_bytes")):
            ms.kernel = _v1_entry(os.path.join(mem, "memory.kmem."))     # kernel memory (cAdvisor's KernelUsage)
        m.memory = ms
        oc = _kv(os.path.join(mem, "memory.oom_control"))
        m.memory_oom_control = cgroups_v1.MemoryOomControl(oom_kill_disable=oc.get("oom_kill_disable", 0),
                                                           under_oom=oc.get("under_oom", 0),
                                                           oom_kill=oc.get("oom_kill", 0))
    elif paths.v2:
        st = _kv(os.path.join(paths.v2, "memory.stat"))
        m.memory = cgroups_v1.MemoryStat(
            cache=st.get("file", 0), rss=st.get("anon", 0), mapped_file=st.get("file_mapped", 0),
            dirty=st.get("file_dirty", 0), writeback=st.get("file_writeback", 0),
            pg_fault=st.get("pgfault", 0), pg_maj_fault=st.get("pgmajfault", 0),
            inactive_anon=st.get("inactive_anon", 0), active_anon=st.get("active_anon", 0),
            inactive_file=st.get("inactive_file", 0), active_file=st.get("active_file", 0),
            unevictable=st.get("unevictable", 0), total_inactive_file=st.get("inactive_file", 0),
            usage=cgroups_v1.MemoryEntry(limit=_int(os.path.join(paths.v2, "memory.max")),
                                         usage=_int(os.path.join(paths.v2, "memory.current")),
                                         max=_int(os.path.join(paths.v2, "memory.peak"))))
        m.memory.swap = _v2_swap(paths.v2, m.memory.usage)
        m.memory.kernel = cgroups_v1.MemoryEntry(usage=_v2_kernel(st))
        ev = _kv(os.path.join(paths.v2, "memory.events"))
        m.memory_oom_control = cgroups_v1.MemoryOomControl(oom_kill=ev.get("oom_kill", 0))
    acct = paths.v1.get("cpuacct")
    if acct:
        usage = cgroups_v1.CPUUsage(total=_int(os.path.join(acct, "cpuacct.usage")))
        per = _read(os.path.join(acct, "cpuacct.usage_percpu"))
        usage.per_cpu = [int(x) for x in (per or "").split()]
        cs = _kv(os.path.join(acct, "cpuacct.stat"))
        usage.user = cs.get("user", 0) * 1_000_000_000 // USER_HZ
        usage.kernel = cs.get("system", 0) * 1_000_000_000 // USER_HZ
        m.cpu = cgroups_v1.CPUStat(usage=usage)
    elif paths.v2:
        cs = _kv(os.path.join(paths.v2, "cpu.stat"))
        m.cpu = cgroups_v1.CPUStat(usage=cgroups_v1.CPUUsage(total=cs.get("usage_usec", 0) * 1000,
                                                             user=cs.get("user_usec", 0) * 1000,
                                                             kernel=cs.get("system_usec", 0) * 1000))
    cpu = paths.v1.get("cpu") or paths.v2
    if cpu and m.cpu is not None:
        cs = _kv(os.path.join(cpu, "cpu.stat"))
        m.cpu.throttling = cgroups_v1.Throttle(periods=cs.get("nr_periods", 0),
                                               throttled_periods=cs.get("nr_throttled", 0),
                                               throttled_time=cs.get("throttled_time",
                                                                     cs.get("throttled_usec", 0) * 1000))
    m.blkio = _blkio(paths)
    pd = paths.dir_for("pids")
    if pd:
        m.pids = cgroups_v1.PidsStat(current=_int(os.path.join(pd, "pids.current")),
                                     limit=_int(os.path.join(pd, "pids.max")))
    return m


def _v1_entry(prefix: str) -> cgroups_v1.MemoryEntry:
    """memory.* or memory.memsw.* counters."""
    return cgroups_v1.MemoryEntry(limit=_int(prefix + "limit_in_bytes"), usage=_int(prefix + "usage_in_bytes"),
                                  max=_int(prefix + "max_usage_in_bytes"), failcnt=_int(prefix + "failcnt"))


def _v2_kernel(st: dict[str, int]) -> int:
    """memory.stat's kernel (Linux 5.18+); before it, the parts the kernel documents it to include."""
    if "kernel" in st:
        return st["kernel"]
    return sum(st.get(k, 0) for k in ("kernel_stack", "pagetables", "percpu", "vmalloc", "slab"))


def _v2_swap(d: str, mem: cgroups_v1.MemoryEntry) -> cgroups_v1.MemoryEntry | None:
    """Swap as v1's memsw (memory + swap, as runc reports it), from memory.swap.*; limit 0: no limit."""
    cur = _read(os.path.join(d, "memory.swap.current"))
    if cur is None:
        return None
    raw = (_read(os.path.join(d, "memory.swap.max")) or "max").strip()
    limit = mem.limit + int(raw) if mem.limit and raw.isdigit() else 0
    return cgroups_v1.MemoryEntry(usage=mem.usage + int(cur.strip() or 0), limit=limit)


def _blkio(paths: CgroupPaths) -> cgroups_v1.BlkIOStat | None:
    """Bytes and operations per device: v1 blkio.throttle.*_recursive (filled on every scheduler), v2 io.stat."""
    d = paths.v1.get("blkio")
    if d:
        return cgroups_v1.BlkIOStat(
            io_service_bytes_recursive=_v1_blkio(os.path.join(d, "blkio.throttle.io_service_bytes_recursive")),
            io_serviced_recursive=_v1_blkio(os.path.join(d, "blkio.throttle.io_serviced_recursive")))
    if not paths.v2:
        return None
    by, ops = [], []
    for line in (_read(os.path.join(paths.v2, "io.stat")) or "").splitlines():
        dev, *kvs = line.split()
        major, _, minor = dev.partition(":")
        kv = dict(x.split("=", 1) for x in kvs if "=" in x)
        if not (major.isdigit() and minor.isdigit()):
            continue
        for out, key, op in ((by, "rbytes", "Read"), (by, "wbytes", "Write"), (ops, "rios", "Read"),
                             (ops, "wios", "Write")):
            if kv.get(key, "").isdigit():
                out.append(cgroups_v1.BlkIOEntry(op=op, major=int(major), minor=int(minor), value=int(kv[key])))
    return cgroups_v1.BlkIOStat(io_service_bytes_recursive=by, io_serviced_recursive=ops)


def _v1_blkio(path: str) -> list:
    out = []
    for line in (_read(path) or "").splitlines():
        parts = line.split()       # "8:0 Read 4096"; the last line is "Total N"
        if len(parts) != 3 or not parts[2].isdigit():
            continue
        major, _, minor = parts[0].partition(":")
        if major.isdigit() and minor.isdigit():
            out.append(cgroups_v1.BlkIOEntry(op=parts[1], major=int(major), minor=int(minor), value=int(parts[2])))
    return out


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


def oom_kill_count(paths: CgroupPaths) -> int:
    mem = paths.v1.get("memory")
    if mem:
        return _kv(os.path.join(mem, "memory.oom_control")).get("oom_kill", 0)
    if paths.v2:
        return _v2_oom_kills(paths.v2) or 0
    return 0


def _v2_oom_kills(d: str) -> int | None:
    """memory.events' oom_kill of the v2 cgroup `d` (hierarchical: a parent counts its children's kills), or
    None when the file cannot be read (the cgroup is gone)."""
    text = _read(os.path.join(d, "memory.events"))
    if text is None:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


class OomWatcher:
    """Calls `on_oom()` each time the cgroup's oom_kill counter rises."""

    def __init__(self, loop, paths: CgroupPaths, on_oom) -> None:  # loop: shim.loop.Loop
        self.loop = loop
        self.paths = paths
        self.on_oom = on_oom
        self.efd = -1
        self._closed = False
        # v2: the parent's memory.events counts this cgroup's kills too. systemd removes a scope's cgroup as soon
        # as its last process is gone, which can be before the shim reads the counter at the init's exit; the
        # parent (the pod's slice) stays, so its count, read before ours at every check, tells a kill we missed.
        parent = os.path.dirname(paths.v2.rstrip("/")) if paths.v2 else ""
        self.parent = parent if parent.startswith(CGROUP_ROOT + "/") else ""
        self.parent_count = self._parent_kills()
        self.count = oom_kill_count(paths)
        mem = paths.v1.get("memory")
        if mem:
            self._register_v1(mem)
        elif paths.v2:
            loop.call_later(1.0, self._poll)

    def _parent_kills(self) -> int | None:
        return _v2_oom_kills(self.parent) if self.parent else None

    def _register_v1(self, mem: str) -> None:
        try:
            efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            ocfd = os.open(os.path.join(mem, "memory.oom_control"), os.O_RDONLY | os.O_CLOEXEC)
            try:
                with open(os.path.join(mem, "cgroup.event_control"), "w") as f:
                    f.write(f"{efd} {ocfd}")
            finally:
                os.close(ocfd)
        except OSError as err:
            log.warning("OOM events unavailable for %s: %s", mem, err)
            return
        self.efd = efd
        self.loop.add_reader(efd, self._on_event)

    def _on_event(self) -> None:
        try:
            os.eventfd_read(self.efd)
        except BlockingIOError:
            return
        except OSError:
            self.close()
            return
        self.check()
        if not os.path.isdir(self.paths.v1.get("memory", "")):
            self.close()         # the eventfd also fires when the cgroup is removed

    def _poll(self) -> None:
        if self._closed:
            return
        self.check()
        if self.paths.v2 and os.path.isdir(self.paths.v2):
            self.loop.call_later(1.0, self._poll)

    def check(self) -> bool:
        """Re-reads the counter (also called at exit, as the last kill may race the eventfd or the poll)."""
        if self.paths.v2 and not self.paths.v1.get("memory"):
            return self._check_v2()
        n = oom_kill_count(self.paths)
        if n > self.count:
            self.count = n
            self.on_oom()
            return True
        return False

    def _check_v2(self) -> bool:
        parent = self._parent_kills()          # before ours: a kill counted in ours after this is in it too
        n = _v2_oom_kills(self.paths.v2)
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
        self._closed = True
        if self.efd >= 0:
            self.loop.remove(self.efd)
            os.close(self.efd)
            self.efd = -1
