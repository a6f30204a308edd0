"""The cgroup v1 (and hybrid) manager: one directory per controller hierarchy under /sys/fs/cgroup.

Owns every v1 cgroup file the runtime writes or reads (limits, devices lists, freezer, stats, OOM events).
Must not know about containers beyond the path it is given; errors name the file and the reason.
"""
from __future__ import annotations

import errno
import os
TYPE_CHECKING = False  # typing costs ~2 ms to import; mypy treats this name as typing's

from runtime.errors import SetupError
from runtime.fsutil import read_small

if TYPE_CHECKING:
    from typing import Any

    from runtime.cgroups.manager import Stats

CGROUP_ROOT = "/sys/fs/cgroup"
USER_HZ = 100


def hierarchies() -> dict[str, str]:
    """controller (or name=X) -> mount point of its v1 hierarchy, from /proc/self/mountinfo. On a hybrid host
    the cgroup2 mount (e.g. /sys/fs/cgroup/unified) is included as "unified": runc places containers there
    too (for process tracking; no limits are written to it)."""
    from runtime import mountinfo
    found: dict[str, str] = {}
    for m in mountinfo.read(fstypes=("cgroup", "cgroup2")):
        if m.fstype == "cgroup2":
            if m.point.startswith(CGROUP_ROOT + "/"):
                found.setdefault("unified", m.point)
        elif m.fstype == "cgroup":
            for opt in m.super_options:
                if opt in ("rw", "ro") or opt.startswith(("release_agent", "clone_children", "nsroot")):
                    continue
                found.setdefault(opt, m.point)
    return found


class V1Manager:
    """`path` is absolute within each hierarchy, e.g. "/husk/abc" -> /sys/fs/cgroup/memory/husk/abc.
    `paths`: controller -> path for the controllers whose path differs (a process's cgroup as
    /proc/<pid>/cgroup names it, see runtime.cgroups.manager_of_pid); `hier`: controller -> mount point, read
    from /proc/self/mountinfo when not given."""

    version = 1

    def __init__(self, path: str, paths: dict[str, str] | None = None,
                 hier: dict[str, str] | None = None) -> None:
        if not path.startswith("/"):
            raise ValueError(f"cgroup path {path!r} is not absolute")
        self.path = path
        self.paths = paths or {}
        self._hier = hier

    # --- paths ---------------------------------------------------------------------------------
    @property
    def hier(self) -> dict[str, str]:
        if self._hier is None:
            self._hier = hierarchies()
        return self._hier

    def dir(self, controller: str) -> str | None:
        mnt = self.hier.get(controller)
        if mnt is None:
            return None
        path = self.paths.get(controller, self.path)
        return mnt + path if path != "/" else mnt

    def _dirs(self) -> list[str]:
        seen: list[str] = []
        for ctrl in self.hier:
            d = self.dir(ctrl)
            if d and d not in seen:
                seen.append(d)
        return seen

    def _write(self, controller: str, name: str, value: str | int) -> None:
        d = self.dir(controller)
        if d is None:
            raise SetupError(f"cgroup controller {controller!r} is not mounted on this host (needed for {name})")
        path = os.path.join(d, name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SetupError(f"cgroup file {path} does not exist: this kernel does not support {name}") from None
        except OSError as e:
            raise SetupError(f"open {path}: {e.strerror}") from None
        try:
            os.write(fd, str(value).encode())
        except OSError as e:
            raise SetupError(f"write {value!r} to {path}: {e.strerror}") from None
        finally:
            os.close(fd)

    def _read(self, controller: str, name: str) -> str | None:
        d = self.dir(controller)
        if d is None:
            return None
        try:
            return read_small(os.path.join(d, name))
        except OSError:
            return None

    def _read_int(self, controller: str, name: str) -> int:
        s = self._read(controller, name)
        if s is None:
            return 0
        s = s.strip()
        if s == "max":
            return 0
        try:
            return int(s)
        except ValueError:
            return 0

    def _has(self, controller: str, name: str) -> bool:
        d = self.dir(controller)
        return d is not None and os.path.exists(os.path.join(d, name))

    # --- lifecycle -----------------------------------------------------------------------------
    def create(self) -> None:
        for ctrl in self.hier:
            d = self.dir(ctrl)
            if d is None:
                continue
            if ctrl == "cpuset":
                self._create_cpuset(d)
                continue
            try:
                os.makedirs(d, exist_ok=True)
            except OSError as e:
                raise SetupError(f"mkdir {d}: {e.strerror}") from None

    def _create_cpuset(self, d: str) -> None:
        # a new cpuset cgroup starts with empty cpus/mems: copy them down from the parent, level by level
        mnt = self.hier["cpuset"]
        parts = [p for p in self.path.split("/") if p]
        cur = mnt
        for part in parts:
            parent, cur = cur, os.path.join(cur, part)
            try:
                os.mkdir(cur)
            except FileExistsError:
                pass
            except OSError as e:
                raise SetupError(f"mkdir {cur}: {e.strerror}") from None
            for name in ("cpuset.cpus", "cpuset.mems"):
                try:
                    with open(os.path.join(cur, name)) as f:
                        if f.read().strip():
                            continue
                    with open(os.path.join(parent, name)) as f:
                        val = f.read().strip()
                    with open(os.path.join(cur, name), "w") as f:
                        f.write(val)
                except OSError as e:
                    raise SetupError(f"cpuset: copy {name} into {cur}: {e.strerror}") from None

    def exists(self) -> bool:
        d = self.dir("memory") or self.dir("pids") or (self._dirs() or [None])[0]
        return d is not None and os.path.isdir(d)

    def apply(self, pid: int) -> None:
        self._move_into("cgroup.procs", pid, f"add pid {pid} to")

    def _move_into(self, name: str, pid: int, what: str, skip: str | None = None) -> None:
        """Writes `pid` to `name` (cgroup.procs or tasks) in every hierarchy's directory but `skip`."""
        for d in self._dirs():
            if d == skip:
                continue
            path = os.path.join(d, name)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, str(pid).encode())
                finally:
                    os.close(fd)
            except FileNotFoundError:
                raise SetupError(f"{what} cgroup {self.path}: {d} does not exist") from None
            except OSError as e:
                raise SetupError(f"{what} {path}: {e.strerror}") from None

    def join_self(self) -> None:
        """Moves the calling process, which must be single-threaded, into this cgroup in every v1 hierarchy but
        a hybrid host's cgroup2 one (dir("unified"): clone3 into it, runtime/child.py): `0` written to `tasks`
        moves the calling thread without the global cgroup_threadgroup_rwsem, whose write side (any pid written
        to `cgroup.procs`) first waits for an RCU grace period, 2-20 ms on this host."""
        self._move_into("tasks", 0, "join", skip=self.dir("unified"))

    def apply_split(self, pid: int, paths: dict[str, str]) -> None:
        """`exec --cgroup ctrl:sub` on v1: moves `pid` into `paths[ctrl]` (absolute within the hierarchy) for
        the controllers named there and into this cgroup for the others."""
        for ctrl in paths:
            if ctrl not in self.hier:
                raise SetupError(f"unknown controller {ctrl!r} in --cgroup (mounted here: {' '.join(self.hier)})")
        by_mount: dict[str, str] = {}
        for ctrl, mnt in self.hier.items():
            want = paths.get(ctrl)
            if want is not None or mnt not in by_mount:
                by_mount[mnt] = want if want is not None else by_mount.get(mnt, self.path)
        for mnt, path in by_mount.items():
            d = mnt + path if path != "/" else mnt
            try:
                with open(os.path.join(d, "cgroup.procs"), "w") as f:
                    f.write(str(pid))
            except FileNotFoundError:
                raise SetupError(f"add pid {pid} to cgroup {path}: {d} does not exist") from None
            except OSError as e:
                raise SetupError(f"add pid {pid} to {d}/cgroup.procs: {e.strerror}") from None

    def destroy(self) -> None:
        """Removes the cgroup in every hierarchy, sub-cgroups first (made by `exec --cgroup` users or by a
        systemd inside the container), as runc does."""
        errors = []
        dirs = []
        for top in self._dirs():
            try:
                dirs += [dp for dp, _d, _f in os.walk(top, topdown=False)]
            except OSError:
                dirs.append(top)
        for d in dirs:
            for attempt in range(50):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    # EBUSY right after the last task exited: the kernel frees the css asynchronously
                    if e.errno == errno.EBUSY and attempt < 49:
                        import time
                        time.sleep(0.01)
                        continue
                    errors.append(f"rmdir {d}: {e.strerror}")
                    break
        if errors:
            raise SetupError("; ".join(errors))

    # --- limits --------------------------------------------------------------------------------
    def set(self, resources: dict[str, Any]) -> None:
        if not resources:
            return
        if resources.get("unified"):
            raise SetupError("linux.resources.unified needs cgroup v2; this host has cgroup v1")
        if "memory" in resources:
            self._set_memory(resources["memory"] or {})
        if "cpu" in resources:
            self._set_cpu(resources["cpu"] or {})
        if "pids" in resources:
            limit = (resources["pids"] or {}).get("limit")
            if limit:  # as runc 1.1.5's fs driver: 0 leaves pids.max alone, any negative value means "max"
                self._write("pids", "pids.max", "max" if limit < 0 else limit)
        if "blockIO" in resources:
            self._set_blkio(resources["blockIO"] or {})
        for i, h in enumerate(resources.get("hugepageLimits") or []):
            if "hugetlb" not in self.hier:
                raise SetupError(f"linux.resources.hugepageLimits[{i}]: no hugetlb cgroup v1 hierarchy on this host")
            self._write("hugetlb", f"hugetlb.{h['pageSize']}.limit_in_bytes", h["limit"])
        net = resources.get("network")
        if net:
            if net.get("classID") is not None:
                self._write("net_cls", "net_cls.classid", net["classID"])
            for p in net.get("priorities") or []:
                self._write("net_prio", "net_prio.ifpriomap", f"{p['name']} {p['priority']}")
        if resources.get("rdma"):
            for dev, lim in resources["rdma"].items():
                parts = [f"{k}={lim[v]}" for k, v in (("hca_handle", "hcaHandles"), ("hca_object", "hcaObjects"))
                         if lim.get(v) is not None]
                self._write("rdma", "rdma.max", f"{dev} {' '.join(parts)}")
        if "devices" in resources:
            self.set_devices(resources.get("devices") or [])

    def _set_memory(self, mem: dict[str, Any]) -> None:
        limit, swap = mem.get("limit"), mem.get("swap")
        has_memsw = self._has("memory", "memory.memsw.limit_in_bytes")
        if limit is not None or swap is not None:
            lim = -1 if limit is None or limit < 0 else limit
            if swap is not None and not has_memsw and swap != lim and swap > 0:
                raise SetupError("linux.resources.memory.swap: this kernel has no swap accounting "
                                 "(memory.memsw.limit_in_bytes)")
            if has_memsw and swap is not None:
                sw = -1 if swap < 0 else swap
                cur = self._read_int("memory", "memory.memsw.limit_in_bytes")
                # memsw must always stay >= limit: raise memsw first when growing, limit first when shrinking
                if sw == -1 or (lim != -1 and sw > cur):
                    self._write("memory", "memory.memsw.limit_in_bytes", sw)
                    if limit is not None:
                        self._write("memory", "memory.limit_in_bytes", lim)
                else:
                    if limit is not None:
                        self._write("memory", "memory.limit_in_bytes", lim)
                    self._write("memory", "memory.memsw.limit_in_bytes", sw)
            elif limit is not None:
                self._write("memory", "memory.limit_in_bytes", lim)
        if mem.get("reservation") is not None:
            self._write("memory", "memory.soft_limit_in_bytes", mem["reservation"])
        if mem.get("kernel") is not None and self._has("memory", "memory.kmem.limit_in_bytes"):
            self._write("memory", "memory.kmem.limit_in_bytes", mem["kernel"])
        if mem.get("kernelTCP") is not None:
            self._write("memory", "memory.kmem.tcp.limit_in_bytes", mem["kernelTCP"])
        sw = mem.get("swappiness")
        if sw is not None and sw != -1 and sw <= 100:
            self._write("memory", "memory.swappiness", sw)
        elif sw is not None and sw > 100 and sw < 2**63:
            raise SetupError(f"linux.resources.memory.swappiness: {sw} is out of range 0..100")
        if mem.get("disableOOMKiller"):
            self._write("memory", "memory.oom_control", 1)
        if mem.get("useHierarchy") is not None:
            self._write("memory", "memory.use_hierarchy", 1 if mem["useHierarchy"] else 0)

    def _set_cpu(self, cpu: dict[str, Any]) -> None:
        if cpu.get("shares"):
            self._write("cpu", "cpu.shares", cpu["shares"])
        period, quota = cpu.get("period"), cpu.get("quota")
        if period:
            self._write("cpu", "cpu.cfs_period_us", period)
        if quota is not None and quota != 0:
            self._write("cpu", "cpu.cfs_quota_us", quota)
        if cpu.get("burst") is not None:
            self._write("cpu", "cpu.cfs_burst_us", cpu["burst"])
        if cpu.get("realtimePeriod"):
            self._write("cpu", "cpu.rt_period_us", cpu["realtimePeriod"])
        if cpu.get("realtimeRuntime"):
            self._write("cpu", "cpu.rt_runtime_us", cpu["realtimeRuntime"])
        if cpu.get("idle") is not None:
            self._write("cpu", "cpu.idle", cpu["idle"])
        if cpu.get("cpus"):
            self._write("cpuset", "cpuset.cpus", cpu["cpus"])
        if cpu.get("mems"):
            self._write("cpuset", "cpuset.mems", cpu["mems"])

    def _set_blkio(self, bio: dict[str, Any]) -> None:
        if bio.get("weight") is not None:
            # runc's fallback: kernels without CFQ have only the BFQ weight file
            name = "blkio.weight" if self._has("blkio", "blkio.weight") else "blkio.bfq.weight"
            if not self._has("blkio", name):
                raise SetupError("linux.resources.blockIO.weight: this kernel has neither blkio.weight "
                                 "nor blkio.bfq.weight")
            self._write("blkio", name, bio["weight"])
        if bio.get("leafWeight") is not None:
            self._write("blkio", "blkio.leaf_weight", bio["leafWeight"])
        for wd in bio.get("weightDevice") or []:
            name = "blkio.weight_device" if self._has("blkio", "blkio.weight_device") else "blkio.bfq.weight_device"
            if wd.get("weight") is not None:
                self._write("blkio", name, f"{wd['major']}:{wd['minor']} {wd['weight']}")
            if wd.get("leafWeight") is not None:
                self._write("blkio", "blkio.leaf_weight_device", f"{wd['major']}:{wd['minor']} {wd['leafWeight']}")
        for key, name in (("throttleReadBpsDevice", "blkio.throttle.read_bps_device"),
                          ("throttleWriteBpsDevice", "blkio.throttle.write_bps_device"),
                          ("throttleReadIOPSDevice", "blkio.throttle.read_iops_device"),
                          ("throttleWriteIOPSDevice", "blkio.throttle.write_iops_device")):
            for td in bio.get(key) or []:
                self._write("blkio", name, f"{td['major']}:{td['minor']} {td['rate']}")

    def set_devices(self, rules: list[dict[str, Any]], defaults: list[dict[str, Any]] | None = None) -> None:
        """v1 devices: deny everything, then apply the config's rules in order, then allow `defaults`."""
        if "devices" not in self.hier:
            raise SetupError("linux.resources.devices: no devices cgroup hierarchy on this host")
        self._write("devices", "devices.deny", "a")
        for r in list(rules) + list(defaults or []):
            line = device_rule(r)
            if line == "a *:* rwm" and r.get("allow") is False:
                continue  # already denied everything
            self._write("devices", "devices.allow" if r.get("allow") else "devices.deny", line)

    # --- processes -----------------------------------------------------------------------------
    def pids(self) -> list[int]:
        d = self.dir("pids") or self.dir("memory") or self.dir("freezer")
        if d is None:
            return []
        out: list[int] = []
        for dirpath, _dirs, _files in os.walk(d):
            try:
                with open(os.path.join(dirpath, "cgroup.procs")) as f:
                    out.extend(int(x) for x in f.read().split())
            except OSError:
                continue
        return out

    def freeze(self) -> None:
        self._freezer("FROZEN")

    def thaw(self) -> None:
        self._freezer("THAWED")

    def _freezer(self, want: str) -> None:
        for _ in range(1000):
            self._write("freezer", "freezer.state", want)
            st = (self._read("freezer", "freezer.state") or "").strip()
            if st == want:
                return
            import time
            time.sleep(0.001)  # FREEZING: tasks are still being stopped
        raise SetupError(f"freezer of {self.path} did not reach {want}")

    def frozen(self) -> bool:
        return (self._read("freezer", "freezer.state") or "").strip() == "FROZEN"

    def kill_all(self, sig: int) -> None:
        # freeze first so that no process can fork a new one between reading the list and signalling
        can_freeze = "freezer" in self.hier and self.exists()
        if can_freeze:
            self.freeze()
        try:
            for pid in self.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        finally:
            if can_freeze:
                self.thaw()

    def oom_event_fd(self) -> int | None:
        d = self.dir("memory")
        if d is None or not os.path.isdir(d):
            return None
        efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        try:
            ofd = os.open(os.path.join(d, "memory.oom_control"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            os.close(efd)
            raise SetupError(f"open {d}/memory.oom_control for OOM events: {e.strerror}") from None
        try:
            with open(os.path.join(d, "cgroup.event_control"), "w") as f:
                f.write(f"{efd} {ofd}")
        except OSError as e:
            os.close(efd)
            raise SetupError(f"register OOM eventfd on {d}/cgroup.event_control: {e.strerror}") from None
        finally:
            os.close(ofd)
        return efd

    def oom_kills(self) -> int | None:
        if self.dir("memory") is None:
            return 0
        text = self._read("memory", "memory.oom_control")
        return None if text is None else _oom_control(text).get("oom_kill", 0)

    # --- stats ---------------------------------------------------------------------------------
    def stats(self, basic: bool = False) -> "Stats":
        from runtime.cgroups.manager import (CpuStats, HugetlbStats, IoStats, MemoryStats, PidsStats, Stats,
                                             working_set)
        if basic:
            return self._basic_stats()
        s = Stats()
        cpu = CpuStats(usage_ns=self._read_int("cpuacct", "cpuacct.usage"))
        cpu.percpu_ns = [int(x) for x in (self._read("cpuacct", "cpuacct.usage_percpu") or "").split()]
        for line in (self._read("cpuacct", "cpuacct.usage_all") or "").splitlines()[1:]:
            parts = line.split()
            if len(parts) == 3:
                cpu.percpu_user_ns.append(int(parts[1]))
                cpu.percpu_system_ns.append(int(parts[2]))
        for line in (self._read("cpuacct", "cpuacct.stat") or "").splitlines():
            k, _, v = line.partition(" ")
            if k == "user":
                cpu.user_ns = int(v) * 1_000_000_000 // USER_HZ
            elif k == "system":
                cpu.system_ns = int(v) * 1_000_000_000 // USER_HZ
        for line in (self._read("cpu", "cpu.stat") or "").splitlines():
            k, _, v = line.partition(" ")
            if k == "nr_periods":
                cpu.nr_periods = int(v)
            elif k == "nr_throttled":
                cpu.nr_throttled = int(v)
            elif k == "throttled_time":
                cpu.throttled_ns = int(v)
        s.cpu = cpu
        raw: dict[str, int] = {}
        for line in (self._read("memory", "memory.stat") or "").splitlines():
            k, _, v = line.partition(" ")
            try:
                raw[k] = int(v)
            except ValueError:
                continue
        usage = self._read_int("memory", "memory.usage_in_bytes")
        limit = self._read_int("memory", "memory.limit_in_bytes")
        if limit >= 2**62:
            limit = 0
        oc = _oom_control(self._read("memory", "memory.oom_control") or "")
        memsw = self._read_int("memory", "memory.memsw.usage_in_bytes")
        s.memory = MemoryStats(
            usage=usage, limit=limit, max_usage=self._read_int("memory", "memory.max_usage_in_bytes"),
            working_set=working_set(usage, raw.get("total_inactive_file", 0)), rss=raw.get("total_rss", 0),
            cache=raw.get("total_cache", 0), swap_usage=max(0, memsw - usage) if memsw else 0,
            oom_events=self._read_int("memory", "memory.failcnt"), oom_kills=oc.get("oom_kill", 0),
            oom_kill_disable=oc.get("oom_kill_disable", 0), under_oom=oc.get("under_oom", 0), raw=raw)
        for key, prefix in (("usage", "memory"), ("swap", "memory.memsw"), ("kernel", "memory.kmem"),
                            ("kernelTCP", "memory.kmem.tcp")):
            if self._has("memory", f"{prefix}.usage_in_bytes"):   # as runc: no usage file, no counter
                s.memory.entries[key] = self._memory_entry(prefix)
        if "kernel" in s.memory.entries:
            s.memory.kernel = s.memory.entries["kernel"].usage
        pmax = (self._read("pids", "pids.max") or "").strip()
        s.pids = PidsStats(current=self._read_int("pids", "pids.current"),
                           limit=0 if pmax in ("", "max") else int(pmax))
        io = IoStats()
        for name, key in (("blkio.throttle.io_service_bytes_recursive", "ioServiceBytesRecursive"),
                          ("blkio.throttle.io_serviced_recursive", "ioServicedRecursive")):
            if self._has("blkio", name):
                io.throttle[key] = self._blkio_file(name)
        for e in io.throttle.get("ioServiceBytesRecursive", ()):
            if e.op == "Read":
                io.read_bytes += e.value
            elif e.op == "Write":
                io.write_bytes += e.value
        for e in io.throttle.get("ioServicedRecursive", ()):
            if e.op == "Read":
                io.read_ios += e.value
            elif e.op == "Write":
                io.write_ios += e.value
        io.entries = self._blkio_entries()
        s.io = io
        s.cpuset = self._cpuset_stats()
        d = self.dir("hugetlb")
        if d and os.path.isdir(d):
            for fn in os.listdir(d):
                if fn.startswith("hugetlb.") and fn.endswith(".usage_in_bytes"):
                    size = fn[len("hugetlb."):-len(".usage_in_bytes")]
                    s.hugetlb[size] = HugetlbStats(
                        usage=self._read_int("hugetlb", fn),
                        max_usage=self._read_int("hugetlb", f"hugetlb.{size}.max_usage_in_bytes"),
                        failcnt=self._read_int("hugetlb", f"hugetlb.{size}.failcnt"))
        return s


    def _basic_stats(self) -> "Stats":
        """stats(basic=True): CPU usage, memory usage/limit/memory.stat and memory+swap, pids.current (6-8
        files). SetupError when the cgroup is gone (its cpuacct.usage or memory.usage_in_bytes unreadable)."""
        from runtime.cgroups.manager import CpuStats, MemoryEntry, MemoryStats, PidsStats, Stats, working_set
        cpu, usage = self._read("cpuacct", "cpuacct.usage"), self._read("memory", "memory.usage_in_bytes")
        if cpu is None or usage is None:
            raise SetupError(f"stats of {self.path}: its cpuacct or memory cgroup is gone")
        raw: dict[str, int] = {}
        for line in (self._read("memory", "memory.stat") or "").splitlines():
            k, _, v = line.partition(" ")
            if v.isdigit():
                raw[k] = int(v)
        used, limit = int(usage), self._read_int("memory", "memory.limit_in_bytes")
        mem = MemoryStats(usage=used, limit=0 if limit >= 2**62 else limit,
                          working_set=working_set(used, raw.get("total_inactive_file", 0)),
                          rss=raw.get("total_rss", 0), cache=raw.get("total_cache", 0), raw=raw)
        mem.entries["usage"] = MemoryEntry(usage=used, limit=limit)
        memsw = self._read("memory", "memory.memsw.usage_in_bytes")
        if memsw is not None:
            mem.entries["swap"] = MemoryEntry(usage=int(memsw),
                                              limit=self._read_int("memory", "memory.memsw.limit_in_bytes"))
            mem.swap_usage = max(0, int(memsw) - used)
        return Stats(cpu=CpuStats(usage_ns=int(cpu)), memory=mem,
                     pids=PidsStats(current=self._read_int("pids", "pids.current")))

    def _memory_entry(self, prefix: str) -> "Any":
        from runtime.cgroups.manager import MemoryEntry
        return MemoryEntry(usage=self._read_int("memory", f"{prefix}.usage_in_bytes"),
                           max_usage=self._read_int("memory", f"{prefix}.max_usage_in_bytes"),
                           limit=self._read_int("memory", f"{prefix}.limit_in_bytes"),
                           failcnt=self._read_int("memory", f"{prefix}.failcnt"))

    # runc's order: the first group whose files exist is reported (BFQ, CFQ, throttle recursive, throttle)
    _BLKIO_GROUPS = (
        (("blkio.bfq.io_serviced_recursive", "ioServicedRecursive"),
         ("blkio.bfq.io_service_bytes_recursive", "ioServiceBytesRecursive")),
        (("blkio.sectors_recursive", "sectorsRecursive"),
         ("blkio.io_service_time_recursive", "ioServiceTimeRecursive"),
         ("blkio.io_wait_time_recursive", "ioWaitTimeRecursive"),
         ("blkio.io_merged_recursive", "ioMergedRecursive"),
         ("blkio.io_time_recursive", "ioTimeRecursive"),
         ("blkio.io_queued_recursive", "ioQueueRecursive"),
         ("blkio.io_serviced_recursive", "ioServicedRecursive"),
         ("blkio.io_service_bytes_recursive", "ioServiceBytesRecursive")),
        (("blkio.throttle.io_serviced_recursive", "ioServicedRecursive"),
         ("blkio.throttle.io_service_bytes_recursive", "ioServiceBytesRecursive")),
        (("blkio.throttle.io_serviced", "ioServicedRecursive"),
         ("blkio.throttle.io_service_bytes", "ioServiceBytesRecursive")),
    )

    def _blkio_entries(self) -> "dict[str, list[Any]]":
        for group in self._BLKIO_GROUPS:
            if not all(self._has("blkio", name) for name, _ in group):
                continue
            out: dict[str, list[Any]] = {}
            for name, key in group:
                entries = self._blkio_file(name)
                if entries:
                    out[key] = entries
            return out
        return {}

    def _blkio_file(self, name: str) -> "list[Any]":
        """The per-device lines of a blkio file ("8:0 Read 4096", or "8:0 4096"); the "Total N" line and
        malformed lines are skipped."""
        from runtime.cgroups.manager import BlkioEntry
        entries = []
        for line in (self._read("blkio", name) or "").splitlines():
            parts = line.split()
            dev = parts[0].split(":") if parts else []
            if len(dev) != 2 or not all(x.isdigit() for x in dev) or len(parts) not in (2, 3) \
                    or not parts[-1].isdigit():
                continue
            op, value = (parts[1], parts[2]) if len(parts) == 3 else ("", parts[1])
            entries.append(BlkioEntry(int(dev[0]), int(dev[1]), op, int(value)))
        return entries

    _CPUSET_FLAGS = ("cpu_exclusive", "mem_hardwall", "mem_exclusive", "memory_migrate", "memory_spread_page",
                     "memory_spread_slab", "memory_pressure", "sched_load_balance", "sched_relax_domain_level")

    def _cpuset_stats(self) -> "Any":
        from runtime.cgroups.manager import CpusetStats
        cs = CpusetStats()
        if self.dir("cpuset") is None:
            return cs
        cs.cpus = _id_list(self._read("cpuset", "cpuset.cpus") or "")
        cs.mems = _id_list(self._read("cpuset", "cpuset.mems") or "")
        for flag in self._CPUSET_FLAGS:
            text = (self._read("cpuset", f"cpuset.{flag}") or "").strip()
            if text.lstrip("-").isdigit():
                cs.flags[flag] = int(text)
        return cs


def _oom_control(text: str) -> dict[str, int]:
    """memory.oom_control ("oom_kill_disable 0\nunder_oom 0\noom_kill 2") as a dict."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if v.strip().isdigit():
            out[k] = int(v)
    return out


def _id_list(text: str) -> list[int]:
    """"0-2,4" -> [0, 1, 2, 4] (cpuset lists); malformed parts are skipped."""
    out: list[int] = []
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (hi.isdigit() or not hi):
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def device_rule(r: dict[str, Any]) -> str:
    """An OCI device cgroup rule as a v1 devices.allow/deny line, e.g. 'c 1:3 rwm'."""
    t = r.get("type") or "a"
    major = r.get("major")
    minor = r.get("minor")
    maj = "*" if major is None or major < 0 else str(major)
    mnr = "*" if minor is None or minor < 0 else str(minor)
    access = r.get("access") or "rwm"
    return f"{t} {maj}:{mnr} {access}"

