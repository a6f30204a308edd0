"""Limits the kernel enforces, seen from a process in the cgroup: OOM kill counted in the stats and signalled
on the OOM fd, pids.max stopping forks, the freezer stopping processes, the device filter refusing opens,
kill_all, and delete removing the cgroup. Tests marked cgroup_v1_too hold for a v1 manager as well."""
from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import time

import pytest

from tests.support.waiting import wait_for
from tests.vm.workload import Died

pytestmark = [pytest.mark.vm, pytest.mark.root]

MiB = 1 << 20


def proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])      # utime + stime


@pytest.mark.cgroup_v1_too
def test_memory_limit_oom_kills_and_is_counted(workload) -> None:
    w = workload({"memory": {"limit": 48 * MiB, "swap": 48 * MiB}})
    m = w.manager
    fd = m.oom_event_fd()
    assert fd is not None
    try:
        assert w.call("alloc", 8 * MiB) == 8 * MiB            # under the limit: fine
        with pytest.raises(Died, match="SIGKILL"):
            w.call("alloc", 128 * MiB)
        assert m.stats().memory.oom_kills >= 1
        ready, _, _ = select.select([fd], [], [], 0)
        assert ready == [fd]                                     # the OOM fd reported it
    finally:
        os.close(fd)


def test_oom_group_kills_every_process(workload, cgroup_version) -> None:
    w = workload({"memory": {"limit": 48 * MiB, "swap": 48 * MiB}, "unified": {"memory.oom.group": "1"}})
    helper = w.call("spawn", "sleep")
    with pytest.raises(Died, match="SIGKILL"):
        w.call("alloc", 128 * MiB)
    wait_for(lambda: w.manager.pids() == [], 10, f"helper {helper} to die with the group OOM kill")


@pytest.mark.cgroup_v1_too
def test_pids_limit_stops_forks(workload) -> None:
    w = workload({"pids": {"limit": 4}})
    forked, err = w.call("fork", 10)
    assert forked == 3                       # the workload itself is the 4th task
    assert err == errno.EAGAIN
    assert w.call("fork", 2) == [2, 0]       # the killed children freed their slots


@pytest.mark.cgroup_v1_too
def test_freeze_stops_every_process_and_thaw_resumes(workload, cgroup_version) -> None:
    w = workload({})
    spinner = w.call("spawn", "spin")
    m = w.manager
    m.freeze()
    assert m.frozen()
    if cgroup_version == 2:
        with open(f"{m.dir}/cgroup.events") as f:
            assert "frozen 1" in f.read().split("\n")
    for pid in (w.pid, spinner):
        assert proc_state(pid) in ("S", "D", "T"), pid   # v2 parks frozen tasks in S, v1 in D
    before = cpu_ticks(spinner)
    time.sleep(0.3)                      # a running spinner would gain ~30 ticks; a frozen one gains none
    assert cpu_ticks(spinner) == before
    m.thaw()
    assert not m.frozen()
    assert w.call("ping") == w.pid
    assert proc_state(spinner) in ("R", "S")   # back to running (S only if preempted at the moment we look)


@pytest.mark.cgroup_v1_too
def test_device_rules_refuse_opens_and_update_replaces_them(workload, tmp_path) -> None:
    rules = [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 1, "minor": 5, "access": "rwm"},   # /dev/zero
        {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "r"},     # /dev/null, read only
    ]
    w = workload({"devices": rules})
    assert w.call("open", "/dev/zero", "rw") == 0
    assert w.call("open", "/dev/null", "r") == 0
    assert w.call("open", "/dev/null", "w") == errno.EPERM
    assert w.call("open", "/dev/null", "rw") == errno.EPERM
    assert w.call("open", "/dev/full", "r") == errno.EPERM
    assert w.call("mknod", str(tmp_path / "null"), "c", 1, 3) == errno.EPERM
    assert w.call("mknod", str(tmp_path / "zero"), "c", 1, 5) == 0

    w.manager.set({"devices": rules + [{"allow": True, "type": "c", "major": 1, "minor": 3, "access": "w"}]})
    assert w.call("open", "/dev/null", "rw") == 0
    assert w.call("open", "/dev/full", "r") == errno.EPERM
    w.manager.set({"devices": [{"allow": True, "access": "rwm"}]})
    assert w.call("open", "/dev/full", "r") == 0


@pytest.mark.cgroup_v1_too
def test_kill_all_and_delete(workload) -> None:
    w = workload({"pids": {"limit": 10}})
    helper = w.call("spawn", "sleep")
    m = w.manager
    assert sorted(m.pids()) == sorted([w.pid, helper])
    m.kill_all(signal.SIGTERM)
    assert os.WIFSIGNALED(w.wait()) and os.WTERMSIG(w.wait()) == signal.SIGTERM
    m.destroy()                              # waits for the helper (killed too, reaped by init) to leave
    assert not m.exists()
    m.destroy()                              # already gone: not an error


def test_kill_all_sigkill_empties_the_cgroup(workload) -> None:
    w = workload({})
    m = w.manager
    w.call("spawn", "spin")
    m.kill_all(signal.SIGKILL)
    assert os.WTERMSIG(w.wait()) == signal.SIGKILL
    m.destroy()
    assert not m.exists()


def test_signalling_a_paused_container_does_not_thaw_it(workload) -> None:
    w = workload({})
    m = w.manager
    m.freeze()
    m.kill_all(signal.SIGTERM)
    with open(f"{m.dir}/cgroup.freeze") as f:
        assert f.read().strip() == "1"        # the freeze request stands (the kernel may still kill the
    m.thaw()                                  # frozen task: a default-action SIGTERM becomes a group kill)
    assert os.WTERMSIG(w.wait()) == signal.SIGTERM


def test_cpu_max_throttles(workload) -> None:
    w = workload({"cpu": {"quota": 10000, "period": 100000}})     # a tenth of one CPU
    w.call("spawn", "spin")
    m = w.manager
    wait_for(lambda: m.stats().cpu.nr_throttled > 0, 10, lambda: f"throttling: {m.stats().cpu}")
    st = m.stats().cpu
    assert st.nr_periods >= st.nr_throttled > 0 and st.throttled_ns > 0


LOOP_CTL_GET_FREE, LOOP_SET_FD, LOOP_CLR_FD = 0x4C82, 0x4C00, 0x4C01   # linux/loop.h


@pytest.fixture
def loop_device(tmp_path):
    """A loop block device over a 4 MiB file (tmpfs in the guest)."""
    backing = tmp_path / "disk.img"
    backing.write_bytes(b"\xab" * (4 * MiB))
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        n = fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)
    finally:
        os.close(ctl)
    dev = f"/dev/loop{n}"
    dev_fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
    file_fd = os.open(backing, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(dev_fd, LOOP_SET_FD, file_fd)
        yield dev, os.major(os.stat(dev).st_rdev), os.minor(os.stat(dev).st_rdev)
    finally:
        fcntl.ioctl(dev_fd, LOOP_CLR_FD, 0)
        os.close(file_fd)
        os.close(dev_fd)


def test_io_stat_counts_reads(workload, loop_device) -> None:
    dev, major, minor = loop_device
    w = workload({"blockIO": {"throttleReadIOPSDevice": [{"major": major, "minor": minor, "rate": 100000}]}})
    assert w.call("read", dev, 2 * MiB) == 2 * MiB
    st = w.manager.stats().io
    assert st.read_bytes >= 2 * MiB and st.read_ios > 0
    with open(f"{w.manager.dir}/io.max") as f:
        assert f.read().strip() == f"{major}:{minor} rbps=max wbps=max riops=100000 wiops=max"
