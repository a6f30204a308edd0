"""The systemd cgroup driver (as runc's libcontainer/cgroups/systemd, cgroup v2 only).

Owns the `slice:prefix:name` cgroupsPath rules, unit names, the unit properties systemd has for linux.resources
(pure functions), and SystemdManager: systemd creates and stops the container's transient scope over D-Bus
(systemd_dbus.py, imported only when a manager talks to systemd); stats, freezer, kill and everything systemd has
no property for go through the v2 manager on the scope's cgroup, as runc's systemd v2 manager calls fs2.
Must not import the D-Bus client at import time: `husk state`/`stats` of a systemd container never need it.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

from runtime.errors import ConfigError, SetupError

FIELD = "linux.cgroupsPath"
DEFAULT_SLICE = "system.slice"
DEFAULT_PREFIX = "husk"         # runc uses "runc" for an empty cgroupsPath
USEC_INFINITY = 2**64 - 1       # systemd's "infinity" for the uint64 properties (runc: math.MaxUint64)
DEFAULT_CPU_PERIOD = 100000     # us, the kernel's default cpu.max period
CPU_QUOTA_PERIOD_SINCE = 242    # systemd versions that know these properties
CPUSET_SINCE = 244


class Unit:
    """Where a container's scope lives: `slice` (the parent slice unit), `name` (the unit's name) and `path`
    (its cgroup, absolute within the cgroup2 mount, as the v2 manager and the state record use it)."""
    __slots__ = ("slice", "name", "path")

    def __init__(self, slice: str, name: str, path: str) -> None:
        self.slice = slice
        self.name = name
        self.path = path

    def __repr__(self) -> str:
        return f"Unit(slice={self.slice!r}, name={self.name!r}, path={self.path!r})"


def expand_slice(slice: str) -> str:
    """systemd's nesting of slice names: "a-b-c.slice" -> "/a.slice/a-b.slice/a-b-c.slice"; "-.slice" is the
    root ("/"). runc's ExpandSlice rules: must end in ".slice" (and be more than that), no "/", no empty
    dash-separated component ("a--b.slice", "-a.slice")."""
    suffix = ".slice"
    if len(slice) <= len(suffix) or not slice.endswith(suffix) or "/" in slice:
        raise ConfigError(FIELD, f"invalid slice name {slice!r}: must be <name>.slice, without '/'")
    stem = slice[:-len(suffix)]
    if stem == "-":
        return "/"
    path, prefix = "", ""
    for component in stem.split("-"):
        if not component:
            raise ConfigError(FIELD, f"invalid slice name {slice!r}: empty component between dashes")
        path += f"/{prefix}{component}{suffix}"
        prefix += component + "-"
    return path


def unit_name(prefix: str, name: str) -> str:
    """runc's getUnitName: a name ending in ".slice" is a slice unit (the prefix is ignored); otherwise the
    scope "<prefix>-<name>.scope", or "<name>.scope" when the prefix is empty."""
    if name.endswith(".slice"):
        return name
    return f"{prefix}-{name}.scope" if prefix else f"{name}.scope"


def parse_path(cgroups_path: str | None, container_id: str) -> Unit:
    """linux.cgroupsPath for the systemd driver: "slice:prefix:name" (slice empty = system.slice); an empty
    path means ":husk:<container id>" (runc: ":runc:<id>")."""
    if not cgroups_path:
        parent, prefix, name = "", DEFAULT_PREFIX, container_id
    else:
        parts = cgroups_path.split(":")
        if len(parts) != 3:
            raise ConfigError(FIELD, f"{cgroups_path!r}: the systemd cgroup driver expects \"slice:prefix:name\" "
                                     f"(e.g. \"system.slice:husk:{container_id}\")")
        parent, prefix, name = parts
    if not name or "/" in name or "/" in prefix:
        raise ConfigError(FIELD, f"{cgroups_path!r}: the unit name part must be non-empty, without '/'")
    parent = parent or DEFAULT_SLICE
    unit = unit_name(prefix, name)
    if unit.endswith(".slice"):
        # runc makes a slice unit here (kubelet's pod slices, without a process); a slice cannot hold the
        # container's processes, so a container cannot be placed in one
        raise ConfigError(FIELD, f"{cgroups_path!r}: {unit} is a slice unit; a container needs a scope "
                                 f"(a name that does not end in .slice)")
    base = expand_slice(parent)
    return Unit(parent, unit, (base.rstrip("/") or "") + "/" + unit)


# --- linux.resources -> unit properties (D-Bus (name, (signature, value)) pairs) -------------------------------
Prop = "tuple[str, tuple[str, Any]]"


def range_to_bits(text: str, field: str) -> bytes:
    """A cpuset list ("0-2,5") as the byte array systemd takes for AllowedCPUs/AllowedMemoryNodes (runc's
    RangeToBits): bit n set for every n, least significant byte first."""
    bits = 0
    for r in text.split(","):
        r = r.strip()
        if not r:
            continue
        start, dash, end = r.partition("-")
        try:
            lo = int(start)
            hi = int(end) if dash else lo
        except ValueError:
            raise ConfigError(field, f"{text!r}: {r!r} is not a number or a range") from None
        if lo < 0 or hi < lo or hi >= 2**32:
            raise ConfigError(field, f"{text!r}: invalid range {r!r}")
        for i in range(lo, hi + 1):
            bits |= 1 << i
    if not bits:
        raise ConfigError(field, f"{text!r}: empty cpu/node list")
    return bits.to_bytes((bits.bit_length() + 7) // 8, "little")


def _u64(value: int) -> int:
    return USEC_INFINITY if value == -1 else value


def _cpu_quota(quota: int, period: int, version: Callable[[], int], out: list[Any]) -> None:
    """runc's addCpuQuota: CPUQuotaPeriodUSec (systemd >= 242) and CPUQuotaPerSecUSec, rounded up to 10 ms
    because systemd keeps the quota as a whole percentage of a CPU."""
    if period and version() >= CPU_QUOTA_PERIOD_SINCE:
        out.append(("CPUQuotaPeriodUSec", ("t", period)))
    if quota or period:
        per_sec = USEC_INFINITY
        if quota > 0:
            per_sec = quota * 1000000 // (period or DEFAULT_CPU_PERIOD)
            if per_sec % 10000:
                per_sec = (per_sec // 10000 + 1) * 10000
        out.append(("CPUQuotaPerSecUSec", ("t", per_sec)))


def _cpuset(key: str, text: str, field: str, version: Callable[[], int], out: list[Any]) -> None:
    bits = range_to_bits(text, field)
    if version() >= CPUSET_SINCE:
        out.append(({"cpus": "AllowedCPUs", "mems": "AllowedMemoryNodes"}[key], ("ay", bits)))


UNIFIED_MEMORY = {"memory.high": "MemoryHigh", "memory.low": "MemoryLow", "memory.min": "MemoryMin",
                  "memory.max": "MemoryMax", "memory.swap.max": "MemorySwapMax"}


def _unified(unified: dict[str, Any], version: Callable[[], int], out: list[Any]) -> None:
    """runc's unifiedResToSystemdProps: the unified keys systemd has a property for; the others are only
    written to the files (by the v2 manager)."""
    from runtime.cgroups.v2_resources import check_unified_key
    p = "linux.resources.unified"
    for key, value in unified.items():
        check_unified_key(key, p)
        if not isinstance(value, str):
            raise ConfigError(f"{p}.{key}", f"values are strings, got {value!r}")
        v = value.strip()
        try:
            if key == "cpu.max":
                fields = v.split()
                if not 1 <= len(fields) <= 2:
                    raise ValueError
                quota = 0 if fields[0] == "max" else int(fields[0])
                period = int(fields[1]) if len(fields) == 2 else DEFAULT_CPU_PERIOD
                _cpu_quota(quota, period, version, out)
            elif key == "cpu.weight":
                out.append(("CPUWeight", ("t", int(v))))
            elif key in ("cpuset.cpus", "cpuset.mems"):
                _cpuset(key.split(".")[1], v, f"{p}.{key}", version, out)
            elif key in UNIFIED_MEMORY:
                out.append((UNIFIED_MEMORY[key], ("t", USEC_INFINITY if v == "max" else int(v))))
            elif key == "pids.max":
                out.append(("TasksMax", ("t", USEC_INFINITY if v == "max" else int(v))))
        except ValueError:
            raise ConfigError(f"{p}.{key}", f"{value!r} is not a value systemd's property takes") from None


def _int(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def resource_properties(resources: dict[str, Any], version: Callable[[], int]) -> list[Any]:
    """The unit properties for `resources` (runc's genV2ResourcesProperties); `version()` gives systemd's
    version, asked only when a property depends on it. 0 means "leave alone", -1 "infinity", as in runc."""
    from runtime.cgroups import v2_resources as v2r
    out: list[Any] = []
    mem = resources.get("memory") or {}
    limit, swap = _int(mem, "limit"), _int(mem, "swap")
    if limit:
        out.append(("MemoryMax", ("t", _u64(limit))))
    if _int(mem, "reservation"):
        out.append(("MemoryLow", ("t", _u64(_int(mem, "reservation")))))
    swap_value = v2r.swap_max(swap, limit)   # OCI swap is memory+swap; MemorySwapMax is swap alone
    if swap_value or swap > 0:
        # swap == limit: no swap (0), as the v2 file; runc leaves the property unset there
        out.append(("MemorySwapMax", ("t", _u64(swap_value))))
    cpu = resources.get("cpu") or {}
    if _int(cpu, "shares"):
        out.append(("CPUWeight", ("t", v2r.cpu_shares_to_weight(_int(cpu, "shares")))))
    _cpu_quota(_int(cpu, "quota"), _int(cpu, "period"), version, out)
    pids = _int(resources.get("pids") or {}, "limit")
    if pids > 0 or pids == -1:
        out.append(("TasksMax", ("t", _u64(pids))))
    for key in ("cpus", "mems"):
        if cpu.get(key):
            _cpuset(key, str(cpu[key]), f"linux.resources.cpu.{key}", version, out)
    if resources.get("unified"):
        _unified(resources["unified"], version, out)
    return out


def scope_properties(unit: Unit, pid: int, container_name: str) -> list[Any]:
    """The fixed properties of a container's scope (runc's Apply): in `unit.slice`, delegated, every
    accounting on, no default dependencies (a scope must not be stopped with a target), the pid placed."""
    return [("Description", ("s", f"husk container {container_name}")),
            ("Slice", ("s", unit.slice)),
            ("Delegate", ("b", True)),
            ("PIDs", ("au", [pid])),
            ("MemoryAccounting", ("b", True)),
            ("CPUAccounting", ("b", True)),
            ("IOAccounting", ("b", True)),
            ("TasksAccounting", ("b", True)),
            ("DefaultDependencies", ("b", False))]


# --- the manager ---------------------------------------------------------------------------------------------
def check_host() -> None:
    from runtime.cgroups import is_unified
    if not is_unified():
        raise SetupError("--systemd-cgroup: husk's systemd cgroup driver needs a cgroup v2 (unified) host; this "
                         "host has cgroup v1/hybrid (use the cgroupfs driver: drop --systemd-cgroup)")


class SystemdManager:
    """The cgroup Manager of a container in a systemd scope. Before `apply(pid)` the scope does not exist:
    `set()` then only validates and keeps the resources; `apply` starts the unit with the pid and those
    properties, then writes the files. Afterwards `set()` changes the unit's properties and the files."""

    version = 2

    def __init__(self, unit: Unit, container_name: str = "", new: bool = False) -> None:
        from runtime.cgroups.v2 import V2Manager
        self.unit = unit
        self.path = unit.path
        self.container_name = container_name or unit.name
        self.fs = V2Manager(unit.path)
        self.new = new                  # create's manager: the unit is started by apply(pid)
        self.started = False            # this manager started the unit (a failed create stops it)
        self._pending: dict[str, Any] | None = None
        self._client: Any = None

    # the D-Bus connection, opened on first use
    def _systemd(self) -> Any:
        if self._client is None:
            from runtime.cgroups import systemd_dbus
            self._client = systemd_dbus.connect()
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def exists(self) -> bool:
        return not self._foreign() and self.fs.exists()

    def create(self) -> None:
        """Nothing to create before the pid is known: systemd refuses a scope without processes."""

    def set(self, resources: dict[str, Any]) -> None:
        if self.new and not self.started:
            # validate now, before systemd is asked for anything: a bad config starts nothing
            from runtime.cgroups import v2_resources
            resource_properties(resources, lambda: 10**6)
            v2_resources.plan(resources, lambda name: True)
            if resources.get("devices") is not None:
                from runtime.cgroups import bpf_devices
                bpf_devices.parse_rules(resources["devices"])
            self._pending = resources
            return
        props = resource_properties(resources, lambda: self._systemd().version())
        if props:
            self._systemd().set_unit_properties(self.unit.name, props)
        self.fs.set(resources)

    def apply(self, pid: int) -> None:
        if not self.new or self.started:
            self.fs.apply(pid)
            return
        resources = self._pending or {}
        client = self._systemd()
        props = scope_properties(self.unit, pid, self.container_name)
        props += resource_properties(resources, client.version)
        client.start_transient_unit(self.unit.name, props)
        self.started = True
        self._pending = None
        # as runc's fs2.CreateCgroupPath: every controller enabled down to the scope (hugetlb, cpuset... that
        # systemd does not delegate by itself), then what systemd has no property for goes into the files
        self.fs.create()
        self.fs.set(resources)

    def stop(self) -> None:
        """Stops the unit and waits for systemd's job (systemd kills what is left and removes the cgroup)."""
        if self._foreign():
            return
        self._systemd().stop_unit(self.unit.name)

    def destroy(self) -> None:
        """Stops the unit (waiting for systemd's job) and removes whatever cgroup is left. A create's manager
        that did not start the unit (systemd refused it, or it belongs to someone else) changes nothing."""
        if self._foreign():
            return
        self.stop()
        self.fs.destroy()

    def _foreign(self) -> bool:
        """A create's manager whose unit was not started (yet): the cgroup at `path`, if any, is someone else's
        (systemd refused the unit because it exists), so a failed create must not kill or list it."""
        return self.new and not self.started

    # the rest is the scope's cgroup files
    def stats(self, basic: bool = False) -> Any:
        return self.fs.stats(basic)

    def pids(self) -> list[int]:
        return [] if self._foreign() else self.fs.pids()

    def freeze(self) -> None:
        self.fs.freeze()

    def thaw(self) -> None:
        self.fs.thaw()

    def frozen(self) -> bool:
        return self.fs.frozen()

    def kill_all(self, sig: int) -> None:
        if not self._foreign():
            self.fs.kill_all(sig)

    def oom_event_fd(self) -> int | None:
        return self.fs.oom_event_fd()

    def oom_kills(self) -> int | None:
        return self.fs.oom_kills()
