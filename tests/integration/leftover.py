"""What a container can leave on the host (state dir, cgroup dirs, mounts, processes), for tests that check a
failure or a delete left nothing behind. Reads /proc and /sys only; removes nothing."""
from __future__ import annotations

import os
from pathlib import Path

from tests.support.mountinfo import entries, mounts_under, unescape


def cgroup_hierarchies() -> list[str]:
    """Mount points of every cgroup v1 hierarchy and of cgroup2 (hybrid hosts have both)."""
    out = []
    for f in entries():
        sep = f.index("-")
        if f[sep + 1] in ("cgroup", "cgroup2"):
            out.append(unescape(f[4]))
    return out


def cgroup_dirs(cgroup_path: str) -> list[str]:
    """The directories of cgroup `cgroup_path` (absolute, as in cgroupsPath) that exist in any hierarchy."""
    return [d for d in (h + cgroup_path for h in cgroup_hierarchies()) if os.path.isdir(d)]


def processes_of(cgroup_path: str, bundle: str | Path | None = None) -> list[int]:
    """Pids of processes in cgroup `cgroup_path` (any hierarchy), or whose root or cwd lies in `bundle`
    (a process that failed before pivot_root)."""
    prefix = str(bundle).rstrip("/") + "/" if bundle is not None else None
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or (stat_fields(int(name)) or ["X"])[0] in ("Z", "X"):
            continue  # zombies have exited: their parent has only not reaped them yet
        try:
            with open(f"/proc/{name}/cgroup") as f:
                paths = [line.rstrip("\n").split(":", 2)[2] for line in f]
            links = [os.readlink(f"/proc/{name}/{link}") + "/" for link in ("root", "cwd")] if prefix else []
        except (OSError, IndexError):
            continue  # exited meanwhile, or a kernel thread
        in_cgroup = any(p == cgroup_path or p.startswith(cgroup_path + "/") for p in paths)
        if in_cgroup or (prefix and any(link.startswith(prefix) for link in links)):
            found.append(int(name))
    return found


def alive(pid: int, start_time: int) -> bool:
    """Whether pid still runs as the process that had `start_time` (a zombie counts as gone)."""
    fields = stat_fields(pid)
    return fields is not None and int(fields[19]) == start_time and fields[0] not in ("Z", "X")


def stat_fields(pid: int) -> list[str] | None:
    """/proc/pid/stat after the comm field (fields[0] is the state), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def start_time(pid: int) -> int:
    fields = stat_fields(pid)
    if fields is None:
        raise AssertionError(f"process {pid} does not exist")
    return int(fields[19])


def leftovers(root: str | Path, cid: str, cgroup_path: str, bundle: str | Path,
              pids: dict[int, int] | None = None) -> list[str]:
    """Everything of container `cid` (state under `root`, cgroup, mounts under `bundle`, processes) still on
    the host; `pids` maps known pids of the container to their start times. Empty when nothing is left."""
    found = []
    if (Path(root) / cid).exists():
        found.append(f"state dir {Path(root) / cid}")
    found += [f"cgroup {d}" for d in cgroup_dirs(cgroup_path)]
    found += [f"mount {m}" for m in mounts_under(bundle)]
    found += [f"process {p}" for p in processes_of(cgroup_path, bundle)]
    found += [f"process {p} still alive" for p, t in (pids or {}).items() if alive(p, t)]
    return found
