"""`husk update`: which resources an update changes, by runc's rules (pure functions), and applying them.

runc's update takes a `linux.resources` JSON (file or stdin) or flags, keeps only the fields it can change
live (memory limit/reservation/swap/kernel/kernelTCP, cpu shares/quota/period/realtime*/cpus/mems/idle,
blockIO weight, pids limit, unified) and treats 0 or "" as "leave as it is". The container's recorded
resources are updated so later calls see them; the cgroup is changed through the Manager's set().
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

from runtime.errors import HuskError

# the fields runc's update copies into the container's cgroup config; everything else is ignored
UPDATABLE: dict[str, tuple[str, ...]] = {
    "memory": ("limit", "reservation", "swap", "kernel", "kernelTCP"),
    "cpu": ("shares", "quota", "period", "realtimeRuntime", "realtimePeriod", "cpus", "mems", "idle"),
    "blockIO": ("weight",),
    "pids": ("limit",),
}

# runc update's flags -> (section, field, kind)
FLAGS: dict[str, tuple[str, str, str]] = {
    "blkio_weight": ("blockIO", "weight", "uint"),
    "cpu_period": ("cpu", "period", "uint"),
    "cpu_quota": ("cpu", "quota", "int"),
    "cpu_share": ("cpu", "shares", "uint"),
    "cpu_rt_period": ("cpu", "realtimePeriod", "uint"),
    "cpu_rt_runtime": ("cpu", "realtimeRuntime", "int"),
    "cpuset_cpus": ("cpu", "cpus", "str"),
    "cpuset_mems": ("cpu", "mems", "str"),
    "memory": ("memory", "limit", "bytes"),
    "memory_reservation": ("memory", "reservation", "bytes"),
    "memory_swap": ("memory", "swap", "bytes"),
    "pids_limit": ("pids", "limit", "int"),
}

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def parse_bytes(text: str, flag: str) -> int:
    """docker's RAMInBytes, as runc uses it: "512", "64m", "1.5g", "2GiB", "100 kb" (binary units); -1 is
    unlimited."""
    if text.strip() == "-1":
        return -1
    s = text.strip().lower()
    if s.endswith("b"):
        s = s[:-1]
    if s.endswith("i"):
        s = s[:-1]
    unit = s[-1:] if s[-1:] in _UNITS and s[-1:] != "" and not s[-1:].isdigit() else ""
    number = s[:len(s) - len(unit)].strip()
    try:
        value = float(number) if "." in number else int(number)
    except ValueError:
        raise HuskError(f"invalid value for --{flag}: invalid size: {text!r}") from None
    if value < 0:
        raise HuskError(f"invalid value for --{flag}: invalid size: {text!r}")
    return int(value * _UNITS[unit])


def from_flags(values: dict[str, str | int | None]) -> dict[str, Any]:
    """The resources the given flags set (keys as in FLAGS, with "-" as "_"); unset flags are left out."""
    out: dict[str, Any] = {}
    for key, raw in values.items():
        if raw is None or raw == "":
            continue
        section, field, kind = FLAGS[key]
        flag = key.replace("_", "-")
        value: Any
        if kind == "str":
            value = str(raw)
        elif kind == "bytes":
            value = parse_bytes(str(raw), flag)
        else:
            try:
                value = int(str(raw), 10)
            except ValueError:
                raise HuskError(f"invalid value for --{flag}: {raw!r} is not an integer") from None
            if kind == "uint" and value < 0:
                raise HuskError(f"invalid value for --{flag}: {raw!r} must not be negative")
        out.setdefault(section, {})[field] = value
    return out


def changes(request: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The fields of a resources request that runc's update applies (0 and "" mean unchanged), and the names of
    the fields it ignores."""
    if not isinstance(request, dict):
        raise HuskError("--resources: must be a JSON object (linux.resources)")
    out: dict[str, Any] = {}
    ignored: list[str] = []
    for section, value in request.items():
        fields = UPDATABLE.get(section)
        if section == "unified":
            if value:
                out["unified"] = dict(value)
            continue
        if fields is None:
            if value:
                ignored.append(section)
            continue
        if not isinstance(value, dict):
            raise HuskError(f"--resources: {section} must be an object")
        for field, v in value.items():
            if field not in fields:
                if v:
                    ignored.append(f"{section}.{field}")
                continue
            if v is None or v == 0 or v == "":
                continue
            out.setdefault(section, {})[field] = v
    return out, ignored


def plan(old: dict[str, Any], change: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what to write to the cgroup, the container's resources afterwards).

    runc's fix-up: an unlimited memory limit without a swap value makes swap unlimited too (the managers skip
    swap where the kernel does not account it). Beyond runc: a new swap value comes with the recorded memory limit (cgroup v2 computes
    memory.swap.max from both), and quota with period (v2's cpu.max holds both)."""
    import copy
    merged = copy.deepcopy(old) if old else {}
    apply = copy.deepcopy(change)
    mem = apply.get("memory")
    if mem is not None:
        if mem.get("limit") == -1 and "swap" not in mem:
            mem["swap"] = -1
        old_mem = merged.get("memory") or {}
        if "swap" in mem and "limit" not in mem and old_mem.get("limit"):
            mem["limit"] = old_mem["limit"]
    cpu = apply.get("cpu")
    if cpu is not None:
        old_cpu = merged.get("cpu") or {}
        if "quota" in cpu and "period" not in cpu and old_cpu.get("period"):
            cpu["period"] = old_cpu["period"]
        if "period" in cpu and "quota" not in cpu and old_cpu.get("quota"):
            cpu["quota"] = old_cpu["quota"]
    for section, value in apply.items():
        if section == "unified":
            merged.setdefault("unified", {}).update(value)
        else:
            merged.setdefault(section, {}).update(value)
    return apply, merged


def read_resources(source: str) -> dict[str, Any]:
    """`--resources FILE` or `-` (stdin): a linux.resources JSON object (lifecycle.update checks the schema)."""
    import sys
    from runtime import jsonload
    try:
        if source == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(source, "rb") as f:
                data = f.read()
    except OSError as e:
        raise HuskError(f"--resources {source}: {e.strerror}") from None
    try:
        res = jsonload.loads(data)
    except ValueError as e:
        raise HuskError(f"--resources {source}: invalid JSON: {e}") from None
    if not isinstance(res, dict):
        raise HuskError(f"--resources {source}: must be a JSON object (linux.resources)")
    return res
