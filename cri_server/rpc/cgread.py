"""A running task's cgroup counters read by husk-cri itself for the stats RPCs (ContainerStats, PodSandboxStats
and their List forms): CPU, memory (+ swap) and pids, from the few files those RPCs need.

Before, every sample was a ttrpc `Stats` call to the task's shim, which read ~45 cgroup files in Python (all of
io.containerd.cgroups.v1.Metrics). Under a kubelet relisting 100 pods that was 200 shim wake-ups a second, ~0.2 s
of shim CPU per second, and on a 2-core node each woken shim tended to take the CPU from husk-cri's event loop in
the middle of its send(2) (wake-up preemption): 1.6 s of 30 s of the loop thread's wall time was spent inside
those sends, and a List arriving meanwhile waited. Now 6-8 small files per object are read here (~0.06 ms;
locating them ~0.03 ms once), with no shim involved. The metrics RPCs (every cAdvisor series: block I/O, kernel
memory, OOM and failcnt counters) still ask the shim for the full reading.

The files are located once per (object, pid), from /proc/<pid>/cgroup (runtime.cgroups), and only when the
cgroup's last path component (v1: the memory controller's) names the object's id (husk's cgroupfs
`<parent>/<id>`, systemd `husk-<id>.scope`, runc's and containerd's the same way): a pid that is not the
task's (reused, or a runtime that names its cgroups otherwise) gives None, and so does a cgroup that is gone;
the caller then asks the shim.
The reading is the runtime's (`Manager.stats(basic=True)`: only the files those RPCs need) mapped by the shim's
mapper (shim/cgroup_watch.to_metrics): the same io.containerd.cgroups.v1.Metrics the shim answers, with only the
fields the stats RPCs read set.
"""
from __future__ import annotations

import os
from typing import Any


def locate(pid: int, object_id: str) -> Any | None:
    """The runtime's manager of `pid`'s cgroup (runtime.cgroups), if that cgroup is the object's (its last
    component names the id; v1: in the cpuacct, memory and pids hierarchies), else None."""
    if pid <= 0 or not object_id:
        return None
    from runtime.cgroups import manager_of_pid
    try:
        cg: Any = manager_of_pid(pid)
    except (OSError, ValueError):
        return None
    if cg.version == 2:
        return cg if object_id in os.path.basename(cg.path) else None
    from runtime.cgroups.v1 import V1Manager
    cg = V1Manager(cg.path, cg.paths, hier=_hierarchies())
    if cg.dir("cpuacct") is None or cg.dir("memory") is None:     # mounted since they were read?
        cg = V1Manager(cg.path, cg.paths, hier=_hierarchies(again=True))
    # Every directory read must be the object's: a process left in a hierarchy's root (or another cgroup) for
    # one controller would report that cgroup's counters.
    dirs = [cg.dir("cpuacct"), cg.dir("memory"), cg.dir("pids")]
    if dirs[0] is None or dirs[1] is None or any(d and object_id not in os.path.basename(d) for d in dirs):
        return None
    return cg


_hier: dict[str, str] = {}


def _hierarchies(again: bool = False) -> dict[str, str]:
    """The v1 hierarchies' mount points (/proc/self/mountinfo, which holds every pod's mounts: ~0.2-0.4 ms to
    parse), read once: the first stats call after 100 pods started located 200 cgroups."""
    if again or not _hier:
        from runtime.cgroups.v1 import hierarchies
        _hier.clear()
        _hier.update(hierarchies())
    return _hier


def read(cg: Any) -> Any:
    """io.containerd.cgroups.v1.Metrics with CPU usage, memory (usage, limit, memory.stat, memory+swap) and
    pids.current; None when the cgroup is gone or unreadable."""
    from runtime.errors import HuskError
    from shim.cgroup_watch import to_metrics
    try:
        return to_metrics(cg.stats(basic=True), cg.version)
    except (OSError, ValueError, HuskError):
        return None
