"""The cgroup v2 (unified hierarchy) manager: one directory per container under the cgroup2 mount.

Owns creation (controllers enabled in every ancestor), limits (via v2_resources + the eBPF device filter),
stats, freezer, kill and removal. It must not decide the cgroup path or touch v1 hierarchies.
"""
from __future__ import annotations

import errno
import os
import select
import time
TYPE_CHECKING = False  # typing costs ~2 ms to import; mypy treats this name as typing's
if TYPE_CHECKING:
    from typing import Any

    from runtime.cgroups.manager import Stats
    from runtime.cgroups.v2_resources import Write

    Prepared = tuple[list[Write], Any]   # V2Manager.prepare's: the file writes, the device rules (or None)

from runtime.cgroups import v2_resources
from runtime.errors import SetupError
from runtime.fsutil import read_small
from runtime import logutil

log = logutil.Logger(__name__)

SIGKILL = 9   # `signal` builds enums on import (~2 ms); kill() compares against the number

FREEZE_TIMEOUT = 10.0      # seconds for the kernel to report frozen/thawed
DESTROY_TIMEOUT = 5.0      # seconds for the last processes to leave before rmdir gives up


_read = read_small


def parse_flat_keyed(text: str) -> dict[str, int]:
    """`key value` lines (cpu.stat, memory.stat, memory.events, cgroup.events)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value:
            try:
                out[key] = int(value)
            except ValueError:
                continue
    return out


def parse_nested_keyed(text: str) -> dict[str, dict[str, int]]:
    """`<key> k=v k=v` lines (io.stat): key -> {k: v}; "max" values are skipped."""
    out: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        key, *fields = line.split()
        entry = out.setdefault(key, {})
        for f in fields:
            k, _, v = f.partition("=")
            if v.isdigit():
                entry[k] = int(v)
    return out


def kernel_memory(stat: dict[str, int]) -> int:
    """memory.stat's kernel (Linux 5.18+); before it, the parts the kernel documents it to include."""
    if "kernel" in stat:
        return stat["kernel"]
    return sum(stat.get(k, 0) for k in ("kernel_stack", "pagetables", "percpu", "vmalloc", "slab"))


def _limit(text: str) -> int:
    text = text.strip()
    return 0 if text in ("max", "") else int(text)


UNLIMITED = 2**64 - 1  # how runc reports a v2 "max"


def _limit_raw(text: str) -> int:
    text = text.strip()
    return UNLIMITED if text in ("max", "") else int(text)


class V2Manager:
    """One container's cgroup on a unified hierarchy. `path` is absolute within the hierarchy ("/husk/abc")."""

    version = 2

    def __init__(self, path: str, mountpoint: str = "/sys/fs/cgroup") -> None:
        if not path.startswith("/") or any(part in (".", "..") for part in path.split("/")):
            raise SetupError(f"cgroup path {path!r}: must be absolute within the hierarchy, without . or ..")
        self.path = "/" + "/".join(p for p in path.split("/") if p)
        self.mountpoint = mountpoint.rstrip("/") or "/"
        self.dir = self.mountpoint + (self.path if self.path != "/" else "")

    # --- helpers --------------------------------------------------------------------------------------------
    def _file(self, name: str) -> str:
        return f"{self.dir}/{name}"

    def _write(self, name: str, value: str, field: str = "") -> None:
        path = self._file(name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise SetupError(self._missing_file_reason(name, field)) from e
            raise SetupError(f"open {path}{f' (for {field})' if field else ''}: {e.strerror}") from e
        try:
            os.write(fd, value.encode())
        except OSError as e:
            raise SetupError(f"write {value!r} to {path}{f' (for {field})' if field else ''}: {e.strerror}") from e
        finally:
            os.close(fd)

    def _missing_file_reason(self, name: str, field: str) -> str:
        what = f"{self._file(name)}{f' (for {field})' if field else ''}"
        if not os.path.isdir(self.dir):
            return f"{what}: the cgroup {self.path} does not exist"
        controller = name.split(".", 1)[0]
        try:
            enabled = _read(self._file("cgroup.controllers")).split()
        except OSError:
            enabled = []
        if controller != "cgroup" and controller not in enabled:
            return (f"{what}: the {controller} controller is not enabled for {self.path} "
                    f"(enabled: {' '.join(enabled) or 'none'})")
        return f"{what}: no such file (the kernel does not support it)"

    def _readf(self, name: str) -> str:
        try:
            return _read(self._file(name))
        except OSError as e:
            raise SetupError(f"read {self._file(name)}: {e.strerror}") from e

    def _has_file(self, name: str) -> bool:
        return os.path.exists(self._file(name))

    def _events(self) -> dict[str, int]:
        return parse_flat_keyed(self._readf("cgroup.events"))

    # --- Manager --------------------------------------------------------------------------------------------
    def exists(self) -> bool:
        return os.path.isfile(self._file("cgroup.procs"))

    def create(self) -> None:
        """mkdir -p the path, enabling in each ancestor's cgroup.subtree_control every controller that ancestor
        has (as runc does), so the leaf gets all of them. Directories created here are removed on failure."""
        if not os.path.isfile(f"{self.mountpoint}/cgroup.controllers"):
            raise SetupError(f"{self.mountpoint} is not a cgroup v2 mount (no cgroup.controllers)")
        created: list[str] = []
        current = self.mountpoint
        parts = [p for p in self.path.split("/") if p]
        try:
            for part in parts:
                self._enable_subtree(current)
                current = f"{current}/{part}"
                try:
                    os.mkdir(current, 0o755)
                    created.append(current)
                except FileExistsError:
                    pass
                except OSError as e:
                    raise SetupError(f"mkdir {current}: {e.strerror}") from e
        except BaseException:
            for d in reversed(created):
                try:
                    os.rmdir(d)
                except OSError as e:
                    log.warning("cgroup %s: cleaning up %s: %s", self.path, d, e.strerror)
            raise
        log.debug("cgroup %s created", self.path)

    @staticmethod
    def _enable_subtree(directory: str) -> None:
        try:
            available = _read(f"{directory}/cgroup.controllers").split()
            enabled = set(_read(f"{directory}/cgroup.subtree_control").split())
        except OSError as e:
            raise SetupError(f"read the controllers of {directory}: {e.strerror}") from e
        missing = [c for c in available if c not in enabled]
        if not missing:
            return
        control = f"{directory}/cgroup.subtree_control"
        try:
            with open(control, "w") as f:
                f.write(" ".join(f"+{c}" for c in missing))
            return
        except OSError:
            pass
        # One at a time: a controller that cannot be enabled here (e.g. the cgroup holds processes) must not
        # keep the others off. A limit that needs it fails later with a message naming the controller.
        for c in missing:
            try:
                with open(control, "w") as f:
                    f.write(f"+{c}")
            except OSError as e:
                log.warning("cannot enable the %s controller in %s: %s", c, control, e.strerror)

    def apply(self, pid: int) -> None:
        self._write("cgroup.procs", str(pid), f"pid {pid}")

    def set(self, resources: dict[str, Any]) -> None:
        self.write(self.prepare(resources))

    def prepare(self, resources: dict[str, Any]) -> "Prepared":
        """Validates `resources` and looks up every file it needs in the (existing) cgroup, writing nothing: a
        bad config changes nothing, and create learns it before it forks anything. `write` applies the result
        (a value the kernel itself refuses can still fail part-way, naming the file)."""
        writes = v2_resources.plan(resources, self._has_file)
        rules = None
        if resources.get("devices") is not None:
            from runtime.cgroups import bpf_devices   # only set() with devices needs it (not state/stats/kill)
            rules = bpf_devices.parse_rules(resources["devices"])
        todo = []
        for w in writes:
            if self._has_file(w.file):
                todo.append(w)
            elif w.missing_ok:
                log.debug("cgroup %s: %s absent, %s=%s skipped", self.path, w.file, w.field, w.value)
            else:
                raise SetupError(self._missing_file_reason(w.file, w.field))
        return todo, rules

    def write(self, prepared: "Prepared") -> None:
        todo, rules = prepared
        for w in todo:
            self._write(w.file, w.value, w.field)
        if rules is not None:
            from runtime.cgroups import bpf_devices
            bpf_devices.install(self.dir, rules)

    def stats(self, basic: bool = False) -> Stats:
        if basic:
            return self._basic_stats()
        # the records import dataclasses (~8 ms): only the verbs that report stats load them, not create/delete
        from runtime.cgroups.manager import (BlkioEntry, CpuStats, HugetlbStats, IoStats, MemoryEntry, MemoryStats,
                                             PidsStats, Stats, working_set)
        st = Stats()
        if self._has_file("cpu.stat"):
            cpu = parse_flat_keyed(self._readf("cpu.stat"))
            st.cpu = CpuStats(usage_ns=cpu.get("usage_usec", 0) * 1000, user_ns=cpu.get("user_usec", 0) * 1000,
                              system_ns=cpu.get("system_usec", 0) * 1000, nr_periods=cpu.get("nr_periods", 0),
                              nr_throttled=cpu.get("nr_throttled", 0),
                              throttled_ns=cpu.get("throttled_usec", 0) * 1000)
        if self._has_file("memory.current"):
            raw = parse_flat_keyed(self._readf("memory.stat"))
            events = parse_flat_keyed(self._readf("memory.events"))
            usage = int(self._readf("memory.current"))
            st.memory = MemoryStats(
                usage=usage,
                limit=_limit(self._readf("memory.max")),
                max_usage=int(self._readf("memory.peak")) if self._has_file("memory.peak") else 0,
                working_set=working_set(usage, raw.get("inactive_file", 0)),
                rss=raw.get("anon", 0),
                cache=raw.get("file", 0),
                swap_usage=(int(self._readf("memory.swap.current"))
                            if self._has_file("memory.swap.current") else 0),
                oom_events=events.get("oom", 0),
                oom_kills=events.get("oom_kill", 0),
                kernel=kernel_memory(raw),
                raw=raw,
            )
            st.memory.entries["usage"] = MemoryEntry(usage=usage, max_usage=st.memory.max_usage,
                                                     limit=_limit_raw(self._readf("memory.max")))
            if self._has_file("memory.swap.current"):
                # runc reports memory+swap here, as v1 counts it
                swap_limit = (_limit_raw(self._readf("memory.swap.max")) if self._has_file("memory.swap.max")
                              else UNLIMITED)
                mem_limit = st.memory.entries["usage"].limit
                st.memory.entries["swap"] = MemoryEntry(
                    usage=st.memory.swap_usage + usage,
                    limit=swap_limit if swap_limit == UNLIMITED else min(UNLIMITED, swap_limit + mem_limit))
        if self._has_file("pids.current"):
            st.pids = PidsStats(current=int(self._readf("pids.current")),
                                limit=_limit(self._readf("pids.max")))
        if self._has_file("io.stat"):
            io = IoStats()
            for name, dev in parse_nested_keyed(self._readf("io.stat")).items():
                io.read_bytes += dev.get("rbytes", 0)
                io.write_bytes += dev.get("wbytes", 0)
                io.read_ios += dev.get("rios", 0)
                io.write_ios += dev.get("wios", 0)
                major, _, minor = name.partition(":")
                if not (major.isdigit() and minor.isdigit()):
                    continue
                for key, op, runc_key in (("rbytes", "Read", "ioServiceBytesRecursive"),
                                          ("wbytes", "Write", "ioServiceBytesRecursive"),
                                          ("dbytes", "Discard", "ioServiceBytesRecursive"),
                                          ("rios", "Read", "ioServicedRecursive"),
                                          ("wios", "Write", "ioServicedRecursive"),
                                          ("dios", "Discard", "ioServicedRecursive")):
                    if key in dev:
                        io.entries.setdefault(runc_key, []).append(
                            BlkioEntry(int(major), int(minor), op, dev[key]))
            st.io = io
        try:
            names = os.listdir(self.dir)
        except OSError as e:
            raise SetupError(f"stats of {self.path}: {e.strerror}") from e
        for name in names:
            if name.startswith("hugetlb.") and name.endswith(".current") and not name.endswith(".rsvd.current"):
                size = name[len("hugetlb."):-len(".current")]
                events = parse_flat_keyed(self._readf(f"hugetlb.{size}.events"))
                st.hugetlb[size] = HugetlbStats(usage=int(self._readf(name)), failcnt=events.get("max", 0))
        return st

    def _basic_stats(self) -> Stats:
        """stats(basic=True): CPU usage, memory usage/limit/memory.stat and memory+swap, pids.current (6-8
        files). SetupError when the cgroup is gone."""
        from runtime.cgroups.manager import CpuStats, MemoryEntry, MemoryStats, PidsStats, Stats, working_set
        usage_ns = 0
        for line in self._readf("cpu.stat").splitlines():
            if line.startswith("usage_usec "):
                usage_ns = int(line[11:]) * 1000
                break
        raw = parse_flat_keyed(self._readf("memory.stat"))
        usage, limit = int(self._readf("memory.current")), _limit_raw(self._readf("memory.max"))
        mem = MemoryStats(usage=usage, limit=0 if limit == UNLIMITED else limit,
                          working_set=working_set(usage, raw.get("inactive_file", 0)), rss=raw.get("anon", 0),
                          cache=raw.get("file", 0), kernel=kernel_memory(raw), raw=raw)
        mem.entries["usage"] = MemoryEntry(usage=usage, limit=limit)
        try:
            swap = int(self._readf("memory.swap.current"))
        except SetupError:
            swap = -1                   # no swap accounting
        if swap >= 0:
            swap_limit = _limit_raw(self._readf("memory.swap.max"))
            mem.swap_usage = swap
            # runc reports memory+swap here, as v1 counts it
            mem.entries["swap"] = MemoryEntry(usage=swap + usage, limit=swap_limit if swap_limit == UNLIMITED
                                              else min(UNLIMITED, swap_limit + limit))
        try:
            pids = int(self._readf("pids.current"))
        except SetupError:
            pids = 0                    # no pids controller
        return Stats(cpu=CpuStats(usage_ns=usage_ns), memory=mem, pids=PidsStats(current=pids))

    def pids(self) -> list[int]:
        out: list[int] = []
        for root, _dirs, _files in os.walk(self.dir):
            try:
                out.extend(int(p) for p in _read(f"{root}/cgroup.procs").split())
            except FileNotFoundError:
                continue   # a sub-cgroup removed while walking
        return out

    def freeze(self) -> None:
        self._set_frozen(True)

    def thaw(self) -> None:
        self._set_frozen(False)

    def frozen(self) -> bool:
        return self._events().get("frozen") == 1

    def _set_frozen(self, on: bool, timeout: float = FREEZE_TIMEOUT) -> None:
        self._write("cgroup.freeze", "1" if on else "0", "freezer")
        want = 1 if on else 0
        # cgroup.events signals a change with POLLPRI; re-read it after every wake-up.
        fd = os.open(self._file("cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
        poller = select.poll()
        poller.register(fd, select.POLLPRI | select.POLLERR)
        deadline = time.monotonic() + timeout
        try:
            while True:
                os.lseek(fd, 0, os.SEEK_SET)
                events = parse_flat_keyed(os.read(fd, 4096).decode())
                if events.get("frozen") == want:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SetupError(f"{self._file('cgroup.events')}: the kernel did not report "
                                     f"frozen {want} within {timeout:.0f} s")
                poller.poll(min(left, 0.1) * 1000)
        finally:
            os.close(fd)

    def kill_all(self, sig: int) -> None:
        if not self.exists():
            return
        if sig == SIGKILL and self._has_file("cgroup.kill"):
            self._write("cgroup.kill", "1", "kill --all")
            return
        # Without cgroup.kill: freeze so no process forks past the list, signal each, thaw -- unless the
        # container was paused before: a signal must not resume it.
        can_freeze = self._has_file("cgroup.freeze")
        was_frozen = can_freeze and self._readf("cgroup.freeze").strip() == "1"
        if can_freeze and not was_frozen:
            self.freeze()
        try:
            for pid in self.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        finally:
            if can_freeze and not was_frozen:
                self.thaw()

    def oom_event_fd(self) -> int | None:
        """An inotify fd that becomes readable whenever memory.events changes; the caller reads the events
        and compares memory.events' oom_kill with the count it saw before (stats().memory.oom_kills)."""
        from runtime.linux import syscalls

        if not self._has_file("memory.events"):
            return None
        fd = syscalls.inotify_init1(syscalls.IN_CLOEXEC | syscalls.IN_NONBLOCK)
        try:
            syscalls.inotify_add_watch(fd, self._file("memory.events"), syscalls.IN_MODIFY)
        except OSError as e:
            os.close(fd)
            raise SetupError(f"watch {self._file('memory.events')}: {e.strerror}") from e
        return fd

    def oom_kills(self) -> int | None:
        try:
            text = _read(self._file("memory.events"))
        except FileNotFoundError:
            return None if not os.path.isdir(self.dir) else 0   # gone, or no memory controller
        except OSError:
            return None
        return parse_flat_keyed(text).get("oom_kill", 0)

    def destroy(self, timeout: float = DESTROY_TIMEOUT) -> None:
        """Removes the cgroup and any sub-cgroups (deepest first), waiting up to `timeout` for exiting
        processes to leave; the parent directories are left for other containers."""
        if not os.path.isdir(self.dir):
            return
        deadline = time.monotonic() + timeout
        subdirs = [root for root, _d, _f in os.walk(self.dir, topdown=False)]
        for d in subdirs:
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY or time.monotonic() >= deadline:
                        left = ""
                        try:
                            left = f" (processes: {_read(f'{d}/cgroup.procs').split()})"
                        except OSError:
                            pass
                        raise SetupError(f"rmdir {d}: {e.strerror}{left}") from e
                    time.sleep(0.01)   # an exiting process leaves the cgroup a moment after its parent reaps it
        log.debug("cgroup %s removed", self.path)
