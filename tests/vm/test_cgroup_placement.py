"""How `husk create` places a container in its cgroup on a cgroup v2 host (cgroupfs driver): the intermediate child
is cloned straight into the cgroup (clone3 with CLONE_INTO_CGROUP, runtime/parent.py _fork_child), so nothing is
ever written to cgroup.procs (a write that waits for an RCU grace period, 11-14 ms), and the limits are written
while the child starts up, before the init runs. The state record keeps the cgroup2 mount for the other verbs."""
from __future__ import annotations

import os

import pytest

from runtime import stages, state as st
from runtime.cgroups.v2 import V2Manager
from runtime.linux import syscalls as sc
from tests.vm.container import PREFIX, ContainerWorkload

pytestmark = [pytest.mark.vm, pytest.mark.root]

MiB = 1 << 20


def _events(fd: int) -> list[int]:
    """The masks of the inotify events queued on `fd` (non-blocking)."""
    masks = []
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        return masks
    at = 0
    while at + 16 <= len(data):
        _wd, mask, _cookie, length = (int.from_bytes(data[at + i:at + i + 4], "little") for i in (0, 4, 8, 12))
        masks.append(mask)
        at += 16 + length
    return masks


def test_the_child_is_cloned_into_the_cgroup_and_limited_before_the_init_runs(bundle_template, tmp_path) -> None:
    path = f"/{PREFIX}-place-{os.getpid()}/c"
    pre = V2Manager(path)
    pre.create()            # made beforehand so that its cgroup.procs can be watched from the start
    fd = sc.inotify_init1(sc.IN_CLOEXEC | sc.IN_NONBLOCK)
    c = ContainerWorkload(bundle_template, tmp_path, {"memory": {"limit": 64 * MiB}, "pids": {"limit": 64}}, path)
    try:
        sc.inotify_add_watch(fd, f"{pre.dir}/cgroup.procs", sc.IN_MODIFY)
        stages.request(str(c.bundle))
        c.start()
        assert _events(fd) == [], "something was written to the container's cgroup.procs"
        with open(f"{pre.dir}/cgroup.procs") as f:
            assert str(c.pid) in f.read().split()
        with open(f"{pre.dir}/memory.max") as f:
            assert f.read().strip() == str(64 * MiB)
        got = {name: (start, dur) for name, start, dur in stages.read(str(c.bundle))}
        assert "cgroup_apply" not in got, got          # no placement by the runtime: the clone did it
        assert "cgroup_limits" in got, got
        limits_end = got["cgroup_limits"][0] + got["cgroup_limits"][1]
        assert limits_end <= got["rootfs"][0], got    # the limits were in place before the init set up its rootfs
        rec = st.load(c.root, c.id)
        assert rec.cgroup2_mount == "/sys/fs/cgroup"
    finally:
        os.close(fd)
        c.close()
        base = V2Manager(os.path.dirname(path))
        if base.exists():
            base.destroy()


def test_a_limit_the_kernel_refuses_after_the_clone_leaves_nothing(bundle_template, tmp_path) -> None:
    """The limits are written after the child was cloned into the cgroup: a value the kernel refuses only then
    (a CPU this machine does not have) fails the create, and the child, the state and the cgroup are gone."""
    path = f"/{PREFIX}-refused-{os.getpid()}/c"
    c = ContainerWorkload(bundle_template, tmp_path, {"cpu": {"cpus": "63"}}, path)
    try:
        before = _stage_pids()
        cp = c.husk("create", "--bundle", str(c.bundle), c.id, check=False)
        assert cp.returncode != 0
        assert "cpuset.cpus" in cp.stderr, cp.stderr
        assert not os.path.exists(os.path.join(c.root, c.id)), "the state dir was left"
        assert not V2Manager(path).exists(), "the container's cgroup was left"
        assert _stage_pids() - before == set(), "the intermediate child or the init was left"
    finally:
        c.close()
        base = V2Manager(os.path.dirname(path))
        if base.exists():
            base.destroy()


def _stage_pids() -> set[str]:
    """Live processes named as the runtime's stages (husk:[1:CHILD], husk:[2:INIT])."""
    found = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name, _, rest = stat.partition(" (")[2].rpartition(") ")
        if name.startswith("husk:[") and rest.split()[0] not in ("Z", "X"):
            found.add(pid)
    return found
