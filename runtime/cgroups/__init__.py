"""Cgroup managers: `manager.py` holds the interface and the shared stats record; `v1.py` and `v2.py` implement it.

This module picks the implementation the host has (`manager_for`; `manager_of_pid` for the cgroup a process
is in, whichever runtime made it: the shim's view of its container) and resolves an OCI cgroupsPath the way
runc's cgroupfs driver does (`resolve_path`); the systemd driver (`slice:prefix:name`, a transient scope made
over D-Bus) is `systemd.py` + `systemd_dbus.py`. It imports the chosen implementation lazily.
"""
from __future__ import annotations

import os
TYPE_CHECKING = False  # typing costs ~2 ms to import; mypy treats this name as typing's

if TYPE_CHECKING:
    from runtime.cgroups.manager import Manager

CGROUP2_SUPER_MAGIC = 0x63677270
CGROUP_ROOT = "/sys/fs/cgroup"
_unified: bool | None = None


def is_unified(root: str = CGROUP_ROOT) -> bool:
    """True when `root` is a cgroup2 mount (pure v2 host); False on v1 and hybrid hosts."""
    global _unified
    if _unified is None or root != CGROUP_ROOT:
        # statfs magic via the type in mountinfo: os has no statfs, and the mount table says the same. A cgroup2
        # root always has cgroup.controllers: without it the scan (~1 ms with hundreds of mounts) is skipped
        result = os.path.exists(os.path.join(root, "cgroup.controllers")) and _mount_type(root) == "cgroup2"
        if root != CGROUP_ROOT:
            return result
        _unified = result
    return _unified


def _mount_type(path: str) -> str | None:
    """The type of the visible mount at exactly `path`, None when nothing is mounted there."""
    from runtime.mountinfo import mount_at
    try:
        m = mount_at(path)
    except OSError:
        return None
    return m.fstype if m is not None else None


def manager_for(path: str, systemd_unit: str | None = None) -> "Manager":
    """The manager of the cgroup at `path`; with `systemd_unit` (a container made with --systemd-cgroup) the
    systemd driver's, whose set() and destroy() also go through systemd (only update and delete need that:
    every other verb reads and writes the scope's files and may use the plain manager of `path`)."""
    if systemd_unit:
        from runtime.cgroups.systemd import SystemdManager, Unit
        return SystemdManager(Unit("", systemd_unit, path))
    if is_unified():
        from runtime.cgroups.v2 import V2Manager
        return V2Manager(path)
    from runtime.cgroups.v1 import V1Manager
    return V1Manager(path)


def proc_cgroup(pid: int | str = "self") -> list[tuple[str, str, str]]:
    """/proc/<pid>/cgroup as (hierarchy id, controllers, path) lines; OSError when the process is gone."""
    with open(f"/proc/{pid}/cgroup") as f:
        return [(hid, ctrls, p) for hid, ctrls, p in (ln.rstrip("\n").split(":", 2) for ln in f if ln.strip())]


def manager_of_pid(pid: int) -> "Manager":
    """The manager of the cgroup process `pid` is in, from /proc/<pid>/cgroup: on a v2 host its `0::` path; on
    v1/hybrid hosts the path of each controller as the file names it (they may differ, e.g. under systemd).
    Raises OSError when the process is gone, ValueError when the file names no cgroup."""
    lines = proc_cgroup(pid)
    if is_unified():
        for hid, _, p in lines:
            if hid == "0":
                from runtime.cgroups.v2 import V2Manager
                return V2Manager(p)
        raise ValueError(f"/proc/{pid}/cgroup: no cgroup v2 line (0::)")
    paths: dict[str, str] = {}
    for hid, ctrls, p in lines:
        for c in (ctrls.split(",") if hid != "0" else ["unified"]):
            if c:
                paths[c] = p
    main = paths.get("memory") or paths.get("pids") or next(iter(paths.values()), None)
    if main is None:
        raise ValueError(f"/proc/{pid}/cgroup: no cgroup named")
    from runtime.cgroups.v1 import V1Manager
    return V1Manager(main, {c: p for c, p in paths.items() if p != main})


def own_cgroup() -> str:
    """The calling process's cgroup, as a relative cgroupsPath is joined under it.

    On cgroup v2 this is the `0::` line. On v1/hybrid hosts each controller may differ; runc resolves per
    controller, but the Manager interface carries one path, so husk takes the path most v1 controllers agree on
    (ties broken by the order in /proc/self/cgroup).
    """
    lines = proc_cgroup()
    if is_unified():
        for hid, _, p in lines:
            if hid == "0":
                return p
        return "/"
    counts: dict[str, int] = {}
    for hid, ctrls, p in lines:
        if hid != "0" and ctrls and not ctrls.startswith("name="):
            counts[p] = counts.get(p, 0) + 1
    if not counts:
        return "/"
    return max(counts, key=lambda p: counts[p])


def resolve_path(cgroups_path: str | None, container_id: str) -> str:
    """runc's cgroupfs rules: absolute as given; relative joined under the caller's own cgroup;
    empty means the relative path `<container_id>`. systemd-style `slice:prefix:name` is refused, as runc
    refuses it without --systemd-cgroup (systemd.parse_path resolves those)."""
    p = cgroups_path or container_id
    if ":" in p and not p.startswith("/"):
        from runtime.errors import ConfigError
        raise ConfigError("linux.cgroupsPath", f"{p!r} is a systemd cgroup path (slice:prefix:name): it needs "
                                               f"the systemd cgroup driver (husk --systemd-cgroup)")
    if not p.startswith("/"):
        p = os.path.join(own_cgroup(), p)
    p = os.path.normpath(p)
    if p.startswith("//"):
        p = p[1:]
    return p
