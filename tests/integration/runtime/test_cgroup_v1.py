"""The v1 cgroup manager on this host's hierarchies: limits, stats, pids, freezer, kill, OOM events, destroy."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import uuid

import pytest

from runtime.cgroups import is_unified, manager_for
from runtime.cgroups.v1 import V1Manager
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(is_unified(), reason="cgroup v1/hybrid host only")]


@pytest.fixture
def mgr():
    m = V1Manager(f"/rtit/v1-{uuid.uuid4().hex[:8]}")
    m.create()
    procs: list[subprocess.Popen] = []
    yield m, procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    if m.frozen():
        m.thaw()
    m.kill_all(signal.SIGKILL)
    for p in procs:
        p.wait()
    m.destroy()


def spawn_in(m: V1Manager, procs: list, code: str) -> subprocess.Popen:
    """A python child that joins the cgroup itself before running `code` (so its allocations are charged)."""
    cg = m.dir("memory") + "/cgroup.procs"
    boot = (f"import os\nfor d in {[m.dir(c) for c in ('memory', 'pids', 'freezer', 'cpu', 'cpuacct')]!r}:\n"
            f"    open(d + '/cgroup.procs', 'w').write(str(os.getpid()))\n")
    p = subprocess.Popen([sys.executable, "-c", boot + code])
    procs.append(p)
    assert os.path.exists(cg)
    return p


def test_manager_for_picks_v1_here() -> None:
    assert isinstance(manager_for("/x"), V1Manager)


def test_limits_stats_pids_freeze_kill(mgr) -> None:
    m, procs = mgr
    m.set({"memory": {"limit": 256 << 20}, "pids": {"limit": 50}, "cpu": {"shares": 300}})
    p = spawn_in(m, procs, "import time\nb = bytearray(8 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
                           "time.sleep(1000)")
    s = wait_for(lambda: (st := m.stats()).memory.usage > 8 << 20 and p.pid in m.pids() and st, 10,
                 "the child's 8 MiB in the cgroup")
    assert s.memory.limit == 256 << 20 and s.memory.usage > 8 << 20 and s.pids.current >= 1 and s.pids.limit == 50
    assert s.cpu.usage_ns > 0
    m.freeze()
    assert m.frozen()
    m.thaw()
    assert not m.frozen()
    m.kill_all(signal.SIGKILL)
    assert p.wait(timeout=10) == -signal.SIGKILL


def test_oom_event_fd_fires(mgr) -> None:
    m, procs = mgr
    m.set({"memory": {"limit": 32 << 20, "swap": 32 << 20}})
    efd = m.oom_event_fd()
    assert efd is not None
    try:
        p = spawn_in(m, procs, "b = bytearray(200 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n")
        ready, _, _ = select.select([efd], [], [], 30)
        assert ready, "no OOM event within 30 s"
        assert int.from_bytes(os.read(efd, 8), "little") >= 1
        assert p.wait(timeout=30) == -signal.SIGKILL
        assert m.stats().memory.oom_kills >= 1
    finally:
        os.close(efd)


def test_devices_rules_written_in_order(mgr) -> None:
    m, _ = mgr
    m.set({"devices": [{"allow": False, "access": "rwm"},
                       {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rw"},
                       {"allow": True, "type": "b", "major": 8, "minor": -1, "access": "r"}]})
    with open(m.dir("devices") + "/devices.list") as f:
        assert f.read().split("\n")[:2] == ["c 1:3 rw", "b 8:* r"]


def test_destroy_is_idempotent() -> None:
    m = V1Manager(f"/rtit/v1-{uuid.uuid4().hex[:8]}")
    m.create()
    assert m.exists()
    m.destroy()
    assert not m.exists()
    m.destroy()
