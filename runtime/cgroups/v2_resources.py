"""OCI `linux.resources` -> the cgroup v2 file writes that apply it (pure: validates and converts, no I/O).

Conversions follow runc's (libcontainer/cgroups utils and fs2), so a config behaves the same under husk and runc:
  cpu.weight = 1 + (shares - 2) * 9999 // 262142   (shares clamped to 2..262144; crun >= 1.11 uses a quadratic
                                                     mapping instead, which only differs between the ends)
  io.weight  = 1 + (blkio weight - 10) * 9999 // 990 (when the BFQ scheduler's io.bfq.weight is absent)
  memory.swap.max = memory.swap - memory.limit      (OCI swap is memory+swap; v2's file counts swap alone)
  -1 means "max"; 0 means "leave alone" for memory limits, swap, pids.limit and cpu shares, as in runc.
Devices (eBPF) are not planned here: see bpf_devices.py. v1-only fields are ignored with a warning.
"""
from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~2 ms to import; mypy treats this name as typing's
if TYPE_CHECKING:
    from typing import Any, Callable

from runtime.errors import ConfigError
from runtime.records import Frozen
from runtime import logutil

log = logutil.Logger(__name__)

ROOT = "linux.resources"
# Files that move, kill or freeze processes: they are not resource settings and must not come from `unified`.
UNIFIED_FORBIDDEN = frozenset({"cgroup.procs", "cgroup.threads", "cgroup.kill", "cgroup.freeze",
                               "cgroup.subtree_control", "cgroup.type"})


_CPU_LIST_CHARS = frozenset("0123456789,- ")


def _is_page_size(size: object) -> bool:
    """"2MB", "1GB", "64KB": the names the kernel gives hugetlb.<size>.* files ("re" stays off the hot path)."""
    return (isinstance(size, str) and len(size) >= 3 and size[-2:] in ("KB", "MB", "GB")
            and size[:-2].isascii() and size[:-2].isdigit() and size[0] != "0")


class Write(Frozen):
    __slots__ = ("file", "value", "field", "missing_ok")
    _DEFAULTS = {"missing_ok": False}
    file: str          # a file name in the container's cgroup directory
    value: str
    field: str         # the config.json path it comes from (for errors)
    missing_ok: bool   # a missing file is not an error (e.g. memory.swap.max without swap)


def cpu_shares_to_weight(shares: int) -> int:
    shares = min(max(shares, 2), 262144)
    return 1 + (shares - 2) * 9999 // 262142


def blkio_weight_to_io_weight(weight: int) -> int:
    return 1 + (weight - 10) * 9999 // 990


def swap_max(swap: int, memory: int) -> int:
    """memory.swap.max from OCI memory.swap (memory+swap) and memory.limit; -1 = max, 0 = leave alone."""
    if memory == -1 and swap == 0:
        return -1                   # unlimited memory, swap unset: unlimited both, as on v1
    if swap in (-1, 0):
        return swap
    if memory in (0, -1):
        raise ConfigError(f"{ROOT}.memory.swap", "a swap limit needs a memory limit")
    if swap < memory:
        raise ConfigError(f"{ROOT}.memory.swap", f"memory+swap ({swap}) must not be below the memory limit "
                                                  f"({memory})")
    return swap - memory


def _int(obj: dict[str, Any], key: str, path: str, minimum: int | None = None) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{path}.{key}", f"must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{path}.{key}", f"must be >= {minimum}, got {value}")
    return value


def _obj(parent: dict[str, Any], key: str, path: str) -> dict[str, Any] | None:
    value = parent.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}.{key}", f"must be an object, got {type(value).__name__}")
    return value


def _list(parent: dict[str, Any], key: str, path: str) -> list[Any]:
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{path}.{key}", f"must be a list, got {type(value).__name__}")
    return value


def _max_or(n: int) -> str:
    return "max" if n == -1 else str(n)


def _memory(mem: dict[str, Any], out: list[Write]) -> None:
    p = f"{ROOT}.memory"
    limit = _int(mem, "limit", p, -1) or 0
    swap = _int(mem, "swap", p, -1) or 0
    reservation = _int(mem, "reservation", p, -1) or 0
    for v1_only in ("kernel", "kernelTCP", "swappiness"):
        if mem.get(v1_only) is not None:
            log.warning("%s.%s has no cgroup v2 equivalent: ignored", p, v1_only)
    if mem.get("disableOOMKiller"):
        log.warning("%s.disableOOMKiller has no cgroup v2 equivalent: ignored", p)
    swap_value = swap_max(swap, limit)
    # Without swap accounting the file is missing; "max" and "0" then describe what happens anyway.
    if swap_value != 0:
        out.append(Write("memory.swap.max", _max_or(swap_value), f"{p}.swap", missing_ok=swap_value == -1))
    elif swap > 0:
        out.append(Write("memory.swap.max", "0", f"{p}.swap", missing_ok=True))   # swap == limit: no swap
    if limit:
        out.append(Write("memory.max", _max_or(limit), f"{p}.limit"))
    if reservation:
        out.append(Write("memory.low", _max_or(reservation), f"{p}.reservation"))


def _cpu(cpu: dict[str, Any], out: list[Write]) -> None:
    p = f"{ROOT}.cpu"
    shares = _int(cpu, "shares", p, 0)
    quota = _int(cpu, "quota", p, -1)
    period = _int(cpu, "period", p, 0)
    burst = _int(cpu, "burst", p, 0)
    idle = _int(cpu, "idle", p, 0)
    if _int(cpu, "realtimeRuntime", p) or _int(cpu, "realtimePeriod", p, 0):
        raise ConfigError(f"{p}.realtimeRuntime", "real-time CPU scheduling groups do not exist on cgroup v2")
    if shares:
        out.append(Write("cpu.weight", str(cpu_shares_to_weight(shares)), f"{p}.shares"))
    if idle is not None:
        out.append(Write("cpu.idle", str(idle), f"{p}.idle"))
    if quota or period:
        value = str(quota) if quota and quota > 0 else "max"
        if period:
            value += f" {period}"
        out.append(Write("cpu.max", value, f"{p}.quota"))
    if burst is not None:
        out.append(Write("cpu.max.burst", str(burst), f"{p}.burst"))
    for key in ("cpus", "mems"):
        value = cpu.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str) or not set(value) <= _CPU_LIST_CHARS:
            raise ConfigError(f"{p}.{key}", f"must be a list like '0-2,5', got {value!r}")
        out.append(Write(f"cpuset.{key}", value, f"{p}.{key}"))


def _pids(pids: dict[str, Any], out: list[Write]) -> None:
    """runc 1.1.5 (fs2): 0 leaves pids.max alone, -1 writes "max"; any other negative value it writes as given and
    the kernel refuses it, so husk refuses it here, before anything is written. (The v1 manager writes "max" for
    every negative value, as runc's fs driver does.)"""
    limit = _int(pids, "limit", f"{ROOT}.pids")
    if not limit:
        return
    if limit < -1:
        raise ConfigError(f"{ROOT}.pids.limit", f"must be -1 (no limit), 0 (leave alone) or positive, got {limit}")
    out.append(Write("pids.max", _max_or(limit), f"{ROOT}.pids.limit"))


def _device(entry: Any, path: str) -> tuple[int, int]:
    if not isinstance(entry, dict):
        raise ConfigError(path, "must be an object")
    major = _int(entry, "major", path, 0)
    minor = _int(entry, "minor", path, 0)
    if major is None or minor is None:
        raise ConfigError(path, "major and minor are required")
    return major, minor


def _block_io(bio: dict[str, Any], has_file: Callable[[str], bool], out: list[Write]) -> None:
    p = f"{ROOT}.blockIO"
    bfq = has_file("io.bfq.weight")
    weight = _int(bio, "weight", p, 0)
    if weight:
        if not 10 <= weight <= 1000:
            raise ConfigError(f"{p}.weight", f"must be 10..1000, got {weight}")
        if bfq:
            out.append(Write("io.bfq.weight", str(weight), f"{p}.weight"))
        else:
            out.append(Write("io.weight", str(blkio_weight_to_io_weight(weight)), f"{p}.weight"))
    if bio.get("leafWeight"):
        log.warning("%s.leafWeight has no cgroup v2 equivalent: ignored", p)
    for i, wd in enumerate(_list(bio, "weightDevice", p)):
        wp = f"{p}.weightDevice[{i}]"
        major, minor = _device(wd, wp)
        w = _int(wd, "weight", wp, 0)
        if not w:
            continue
        if not 10 <= w <= 1000:
            raise ConfigError(f"{wp}.weight", f"must be 10..1000, got {w}")
        if bfq:
            out.append(Write("io.bfq.weight", f"{major}:{minor} {w}", wp))
        else:
            out.append(Write("io.weight", f"{major}:{minor} {blkio_weight_to_io_weight(w)}", wp))
    for key, name in (("throttleReadBpsDevice", "rbps"), ("throttleWriteBpsDevice", "wbps"),
                      ("throttleReadIOPSDevice", "riops"), ("throttleWriteIOPSDevice", "wiops")):
        for i, td in enumerate(_list(bio, key, p)):
            tp = f"{p}.{key}[{i}]"
            major, minor = _device(td, tp)
            rate = _int(td, "rate", tp, 0) or 0
            # 0 removes the limit, as writing 0 to a v1 throttle file does
            out.append(Write("io.max", f"{major}:{minor} {name}={rate or 'max'}", tp))


def _hugetlb(limits: list[Any], has_file: Callable[[str], bool], out: list[Write]) -> None:
    for i, h in enumerate(limits):
        hp = f"{ROOT}.hugepageLimits[{i}]"
        if not isinstance(h, dict):
            raise ConfigError(hp, "must be an object")
        size = h.get("pageSize")
        if not _is_page_size(size):
            raise ConfigError(f"{hp}.pageSize", f"must look like 2MB or 1GB, got {size!r}")
        limit = _int(h, "limit", hp, 0)
        if limit is None:
            raise ConfigError(f"{hp}.limit", "is required")
        if not has_file(f"hugetlb.{size}.max"):
            raise ConfigError(f"{hp}.pageSize", f"the kernel has no {size} huge pages (no hugetlb.{size}.max)")
        out.append(Write(f"hugetlb.{size}.max", str(limit), f"{hp}.limit"))
        if has_file(f"hugetlb.{size}.rsvd.max"):
            out.append(Write(f"hugetlb.{size}.rsvd.max", str(limit), f"{hp}.limit"))


def _rdma(rdma: dict[str, Any], out: list[Write]) -> None:
    for dev, lim in sorted(rdma.items()):
        rp = f"{ROOT}.rdma.{dev}"
        if not isinstance(lim, dict):
            raise ConfigError(rp, "must be an object")
        if not dev or any(c.isspace() for c in dev):
            raise ConfigError(rp, "device name must be non-empty without spaces")
        parts = []
        for key, name in (("hcaHandles", "hca_handle"), ("hcaObjects", "hca_object")):
            v = _int(lim, key, rp, 0)
            if v is not None:
                parts.append(f"{name}={v}")
        if parts:
            out.append(Write("rdma.max", f"{dev} {' '.join(parts)}", rp))


def check_unified_key(key: Any, path: str) -> str:
    """A unified key must name a plain file of the cgroup directory: no path, no dot-dot, not a process-moving
    file."""
    if not isinstance(key, str) or not key:
        raise ConfigError(path, "keys must be non-empty strings")
    if "/" in key or "\0" in key or key in (".", "..") or key.startswith("."):
        raise ConfigError(f"{path}.{key}", "must be a file name of the cgroup directory, not a path")
    if key in UNIFIED_FORBIDDEN:
        raise ConfigError(f"{path}.{key}", "moves, kills or freezes processes; not a resource setting")
    if "." not in key:
        raise ConfigError(f"{path}.{key}", "must be <controller>.<file>, e.g. memory.high")
    return key


def _unified(unified: dict[str, Any], out: list[Write]) -> None:
    p = f"{ROOT}.unified"
    for key, value in unified.items():
        check_unified_key(key, p)
        if not isinstance(value, str):
            raise ConfigError(f"{p}.{key}", f"values are strings, got {value!r}")
        out.append(Write(key, value, f"{p}.{key}"))


def plan(resources: dict[str, Any], has_file: Callable[[str], bool]) -> list[Write]:
    """The writes for `resources`, in the order runc applies them (unified last, so it wins).
    `has_file(name)` tells whether the cgroup has a file (to choose BFQ, check hugetlb sizes)."""
    if not isinstance(resources, dict):
        raise ConfigError(ROOT, "must be an object")
    out: list[Write] = []
    if (pids := _obj(resources, "pids", ROOT)) is not None:
        _pids(pids, out)
    if (mem := _obj(resources, "memory", ROOT)) is not None:
        _memory(mem, out)
    if (bio := _obj(resources, "blockIO", ROOT)) is not None:
        _block_io(bio, has_file, out)
    if (cpu := _obj(resources, "cpu", ROOT)) is not None:
        _cpu(cpu, out)
    _hugetlb(_list(resources, "hugepageLimits", ROOT), has_file, out)
    if (rdma := _obj(resources, "rdma", ROOT)) is not None:
        _rdma(rdma, out)
    if (net := _obj(resources, "network", ROOT)) is not None and (net.get("classID") or net.get("priorities")):
        raise ConfigError(f"{ROOT}.network", "net_cls/net_prio do not exist on cgroup v2")
    if (unified := _obj(resources, "unified", ROOT)) is not None:
        _unified(unified, out)
    return out
