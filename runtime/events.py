"""`husk events`: a container's cgroup stats and OOM notifications as runc's JSON event stream.

Owns the event records (runc's types/events.go shapes, field names and omit-when-zero rules) and the loop
that emits them; the numbers come from the cgroup Manager (stats(), oom_event_fd()). It never changes the
container.
"""
from __future__ import annotations

import os
import sys
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TextIO

    from runtime.cgroups.manager import MemoryEntry, Stats

from runtime import state as st
from runtime.errors import HuskError

DEFAULT_INTERVAL = 5.0


def _omit_zero(d: dict[str, Any]) -> dict[str, Any]:
    """Go's `omitempty` on numbers, strings and slices."""
    return {k: v for k, v in d.items() if v not in (0, "", None, [])}


def _memory_entry(e: MemoryEntry | None) -> dict[str, Any]:
    if e is None:
        return {"limit": 0, "failcnt": 0}
    out: dict[str, Any] = {"limit": e.limit}
    if e.usage:
        out["usage"] = e.usage
    if e.max_usage:
        out["max"] = e.max_usage
    out["failcnt"] = e.failcnt
    return out


def stats_data(s: Stats) -> dict[str, Any]:
    """runc's types.Stats for one sample, key for key."""
    cpu = s.cpu
    usage = _omit_zero({"total": cpu.usage_ns, "percpu": cpu.percpu_ns, "percpu_kernel": cpu.percpu_system_ns,
                        "percpu_user": cpu.percpu_user_ns})
    usage["kernel"] = cpu.system_ns
    usage["user"] = cpu.user_ns
    throttling = _omit_zero({"periods": cpu.nr_periods, "throttledPeriods": cpu.nr_throttled,
                             "throttledTime": cpu.throttled_ns})
    cs = s.cpuset
    flags = cs.flags
    cpuset: dict[str, Any] = {}
    if cs.cpus:
        cpuset["cpus"] = cs.cpus
    cpuset["cpu_exclusive"] = flags.get("cpu_exclusive", 0)
    if cs.mems:
        cpuset["mems"] = cs.mems
    for key in ("mem_hardwall", "mem_exclusive", "memory_migrate", "memory_spread_page", "memory_spread_slab",
                "memory_pressure", "sched_load_balance", "sched_relax_domain_level"):
        cpuset[key] = flags.get(key, 0)
    mem = s.memory
    memory: dict[str, Any] = {}
    cache = mem.raw.get("cache", mem.raw.get("file", 0))  # v1 "cache", v2 "file", as runc reads them
    if cache:
        memory["cache"] = cache
    for key in ("usage", "swap", "kernel", "kernelTCP"):
        memory[key] = _memory_entry(mem.entries.get(key))
    if mem.raw:
        memory["raw"] = {k: mem.raw[k] for k in sorted(mem.raw)}
    blkio = {key: [_omit_zero({"major": e.major, "minor": e.minor, "op": e.op, "value": e.value}) for e in entries]
             for key, entries in s.io.entries.items() if entries}
    hugetlb = {size: {**_omit_zero({"usage": h.usage, "max": h.max_usage}), "failcnt": h.failcnt}
               for size, h in sorted(s.hugetlb.items())}
    return {
        "cpu": {"usage": usage, "throttling": throttling},
        "cpuset": cpuset,
        "memory": memory,
        "pids": _omit_zero({"current": s.pids.current, "limit": s.pids.limit}),
        "blkio": blkio,
        "hugetlb": hugetlb,
        "intel_rdt": {},
        "network_interfaces": None,
    }


def event(kind: str, container_id: str, data: Any = None) -> str:
    """One line of the stream (runc's types.Event: type, id, data omitted when empty)."""
    rec: dict[str, Any] = {"type": kind, "id": container_id}
    if data is not None:
        rec["data"] = data
    return st.dumps_json(rec)


def parse_duration(text: str) -> float:
    """Go's time.ParseDuration for what --interval takes ("5s", "500ms", "1m30s", "2.5s"); seconds."""
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    s = text.strip()
    if s in ("0", "+0", "-0"):
        return 0.0
    sign = -1.0 if s.startswith("-") else 1.0
    s = s.lstrip("+-")
    total, i, matched = 0.0, 0, False
    while i < len(s):
        j = i
        while j < len(s) and (s[j].isdigit() or s[j] == "."):
            j += 1
        k = j
        while k < len(s) and not (s[k].isdigit() or s[k] == "."):
            k += 1
        number, unit = s[i:j], s[j:k]
        if not number or unit not in units:
            raise HuskError(f"--interval: invalid duration {text!r} (e.g. 5s, 500ms, 1m)")
        try:
            total += float(number) * units[unit]
        except ValueError:
            raise HuskError(f"--interval: invalid duration {text!r}") from None
        matched = True
        i = k
    if not matched:
        raise HuskError(f"--interval: invalid duration {text!r} (e.g. 5s, 500ms, 1m)")
    return sign * total


def _running(root: str, rec: st.Record) -> bool:
    try:
        return st.status(root, rec) != "stopped"
    except OSError:
        return False


def run(root: str, container_id: str, *, interval: float = DEFAULT_INTERVAL, stats_once: bool = False,
        out: TextIO | None = None, clock: Callable[[], float] | None = None) -> int:
    """Prints events until the container stops: a stats event every `interval` seconds and an oom event
    whenever the memory controller reports one. `stats_once`: one stats event, then return.
    runc keeps printing errors after the container is gone; husk ends the stream with status 0 instead."""
    import select
    import time
    out = out or sys.stdout
    clock = clock or time.monotonic
    rec = st.load(root, container_id)
    if not _running(root, rec):
        raise HuskError(f"container with id {container_id} is not running")
    mgr = st.cgroup_manager(rec)

    def emit(line: str) -> bool:
        try:
            out.write(line + "\n")
            out.flush()
            return True
        except BrokenPipeError:
            return False

    if stats_once:
        emit(event("stats", container_id, stats_data(mgr.stats())))
        return 0
    if interval <= 0:
        raise HuskError("duration interval must be greater than 0")
    fd = mgr.oom_event_fd()
    oom_kills = mgr.stats().memory.oom_kills if fd is not None and _inotify_style(mgr) else 0
    try:
        pidfd = os.pidfd_open(rec.pid)   # readable when the init exits: the stream ends then
    except ProcessLookupError:
        pidfd = None
    if pidfd is not None and not st.init_alive(rec):
        os.close(pidfd)
        pidfd = None
    next_tick = clock() + interval
    try:
        while True:
            if pidfd is None:
                return 0
            timeout = max(0.0, next_tick - clock())
            ready = select.select([pidfd] + ([fd] if fd is not None else []), [], [], timeout)[0]
            if fd is not None and fd in ready:
                fired, oom_kills = _oom_fired(mgr, fd, oom_kills)  # type: ignore[arg-type]
                if fired is None:   # v1: the eventfd also fires when the cgroup is removed
                    os.close(fd)  # type: ignore[arg-type]
                    fd = None
                elif fired and not emit(event("oom", container_id)):
                    return 0
                continue
            if pidfd in ready:
                # the OOM killer may have just ended the init: report that before the stream ends
                if fd is not None and select.select([fd], [], [], 0.05)[0]:
                    fired, oom_kills = _oom_fired(mgr, fd, oom_kills)
                    if fired:
                        emit(event("oom", container_id))
                return 0
            next_tick += interval
            if not _running(root, rec) or not mgr.exists():
                return 0
            try:
                data = stats_data(mgr.stats())
            except (OSError, HuskError):
                if not _running(root, rec):
                    return 0
                raise
            if not emit(event("stats", container_id, data)):
                return 0
    finally:
        for f in (fd, pidfd):
            if f is not None:
                os.close(f)


def _inotify_style(mgr: Any) -> bool:
    """cgroup v2 signals any change of memory.events; v1's eventfd counts OOM events themselves."""
    from runtime.cgroups import is_unified
    return is_unified()


def _oom_fired(mgr: Any, fd: int, seen: int) -> tuple[bool | None, int]:
    """(an OOM happened? None when the cgroup is gone, the oom_kill count now)."""
    if _inotify_style(mgr):
        try:
            os.read(fd, 65536)  # drain the inotify records
        except BlockingIOError:
            pass
        if not mgr.exists():
            return None, seen
        now = mgr.stats().memory.oom_kills
        return now > seen, now
    os.read(fd, 8)  # the eventfd counter
    return (True if mgr.exists() else None), seen
