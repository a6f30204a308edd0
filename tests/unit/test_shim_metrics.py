"""The shim's one Stats -> io.containerd.cgroups.v1.Metrics mapper (shim/cgroup_watch.py) over the runtime's
cgroup managers, the shared working-set formula, and the cgroup of a pid as /proc/<pid>/cgroup names it."""
from __future__ import annotations

import os

import pytest

from cri_server.rpc import stats as cri_stats
from runtime import cgroups
from runtime.cgroups.manager import BlkioEntry, IoStats, MemoryEntry, MemoryStats, PidsStats, Stats, working_set
from runtime.cgroups.v1 import V1Manager
from runtime.cgroups.v2 import UNLIMITED, V2Manager
from shim import cgroup_watch


def test_working_set_is_usage_less_inactive_file_never_negative():
    assert working_set(100, 30) == 70
    assert working_set(30, 100) == 0 and working_set(0, 0) == 0


def test_cri_working_set_is_the_runtime_formula():
    m = cgroup_watch.to_metrics(Stats(memory=MemoryStats(raw={"total_inactive_file": 30},
                                                         entries={"usage": MemoryEntry(usage=100)})), 1)
    assert cri_stats.memory_of(m).working_set == working_set(100, 30) == 70


def test_v2_stats_map_onto_v1_names():
    st = Stats(memory=MemoryStats(
        raw={"anon": 7, "file": 3, "file_mapped": 1, "inactive_file": 2, "pgfault": 9, "pgmajfault": 4},
        oom_kills=2, kernel=124,
        entries={"usage": MemoryEntry(usage=100, max_usage=120, limit=UNLIMITED),
                 "swap": MemoryEntry(usage=125, limit=UNLIMITED)}),
        pids=PidsStats(current=3, limit=10),
        io=IoStats(entries={"ioServiceBytesRecursive": [BlkioEntry(8, 0, "Read", 4096), BlkioEntry(8, 0, "Write", 512),
                                                        BlkioEntry(8, 0, "Discard", 0)]}))
    m = cgroup_watch.to_metrics(st, 2)
    assert (m.memory.rss, m.memory.cache, m.memory.mapped_file, m.memory.pg_fault, m.memory.pg_maj_fault) == \
        (7, 3, 1, 9, 4)
    assert m.memory.total_inactive_file == 2
    assert (m.memory.usage.usage, m.memory.usage.max, m.memory.usage.limit) == (100, 120, 0)   # "max": 0
    assert (m.memory.swap.usage, m.memory.swap.limit) == (125, 0)
    assert m.memory.kernel.usage == 124 and m.memory_oom_control.oom_kill == 2
    assert [(e.op, e.value) for e in m.blkio.io_service_bytes_recursive] == [("Read", 4096), ("Write", 512)]
    assert (m.pids.current, m.pids.limit) == (3, 10)


def test_v2_without_memory_controller_has_no_memory():
    assert cgroup_watch.to_metrics(Stats(), 2).memory is None


def test_v1_stats_keep_kernel_names_and_oom_control():
    st = Stats(memory=MemoryStats(
        raw={"total_rss": 5, "pgfault": 6, "hierarchical_memsw_limit": 7, "total_pgmajfault": 8},
        oom_kills=1, oom_kill_disable=1, under_oom=1,
        entries={"usage": MemoryEntry(usage=100, limit=200, max_usage=150, failcnt=2)}))
    m = cgroup_watch.to_metrics(st, 1)
    assert (m.memory.total_rss, m.memory.pg_fault, m.memory.hierarchical_swap_limit,
            m.memory.total_pg_maj_fault) == (5, 6, 7, 8)
    assert (m.memory.usage.limit, m.memory.usage.failcnt) == (200, 2) and m.memory.swap is None
    oc = m.memory_oom_control
    assert (oc.oom_kill_disable, oc.under_oom, oc.oom_kill) == (1, 1, 1)
    assert cgroup_watch.to_metrics(Stats(), 1).memory is None and cgroup_watch.to_metrics(Stats(), 1).blkio is None


def test_v1_blkio_is_the_throttle_counters_whatever_the_scheduler(tmp_path):
    """With BFQ's files present the runtime's runc-ordered entries are BFQ's; the shim reports the throttle
    counters (filled on every scheduler), as before."""
    blk = tmp_path / "blkio"
    blk.mkdir()
    for name, text in {"blkio.bfq.io_service_bytes_recursive": "8:0 Read 1\nTotal 1\n",
                       "blkio.bfq.io_serviced_recursive": "8:0 Read 1\nTotal 1\n",
                       "blkio.throttle.io_service_bytes_recursive": "8:0 Read 4096\n8:0 Write 512\nTotal 4608\n",
                       "blkio.throttle.io_serviced_recursive": "8:0 Read 2\n8:0 Write 1\nTotal 3\n"}.items():
        (blk / name).write_text(text)
    mgr = V1Manager("/", hier={"blkio": str(blk)})
    st = mgr.stats()
    assert st.io.entries["ioServiceBytesRecursive"] == [BlkioEntry(8, 0, "Read", 1)]
    assert (st.io.read_bytes, st.io.write_bytes, st.io.read_ios, st.io.write_ios) == (4096, 512, 2, 1)
    m = cgroup_watch.metrics(mgr)
    assert [(e.op, e.value) for e in m.blkio.io_service_bytes_recursive] == [("Read", 4096), ("Write", 512)]
    assert [(e.op, e.value) for e in m.blkio.io_serviced_recursive] == [("Read", 2), ("Write", 1)]


def test_a_cgroup_gone_gives_empty_metrics(tmp_path):
    m = cgroup_watch.metrics(V2Manager("/gone", str(tmp_path)))
    assert m.memory is None and m.cpu is None


def test_v1_oom_counter_and_gone(tmp_path):
    mem = tmp_path / "memory"
    mem.mkdir()
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert V1Manager("/", hier={"memory": str(mem)}).oom_kills() == 3
    assert V1Manager("/", hier={}).oom_kills() == 0                       # no memory controller
    assert V1Manager("/x", hier={"memory": str(mem)}).oom_kills() is None  # the cgroup is gone


def test_cgroup_of_a_pid_follows_each_controller(monkeypatch):
    monkeypatch.setattr(cgroups, "is_unified", lambda root=cgroups.CGROUP_ROOT: False)
    monkeypatch.setattr(cgroups, "proc_cgroup", lambda pid="self": [
        ("9", "name=systemd", "/sys"), ("4", "memory", "/pod/c1"), ("3", "pids", "/pod/c1"),
        ("2", "cpu,cpuacct", "/other"), ("0", "", "/u")])
    mgr = cgroup_watch.cgroup_of(123)
    mgr._hier = {"memory": "/m", "pids": "/p", "cpu": "/c", "cpuacct": "/c", "name=systemd": "/s", "unified": "/un"}
    assert mgr.path == "/pod/c1" and mgr.version == 1
    assert (mgr.dir("memory"), mgr.dir("pids"), mgr.dir("cpuacct"), mgr.dir("name=systemd"), mgr.dir("unified")) \
        == ("/m/pod/c1", "/p/pod/c1", "/c/other", "/s/sys", "/un/u")


def test_cgroup_of_a_pid_on_v2(monkeypatch):
    monkeypatch.setattr(cgroups, "is_unified", lambda root=cgroups.CGROUP_ROOT: True)
    monkeypatch.setattr(cgroups, "proc_cgroup", lambda pid="self": [("0", "", "/kubepods.slice/c1.scope")])
    mgr = cgroup_watch.cgroup_of(123)
    assert (mgr.version, mgr.dir) == (2, "/sys/fs/cgroup/kubepods.slice/c1.scope")


def test_cgroup_of_this_process():
    mgr = cgroup_watch.cgroup_of(os.getpid())
    with open("/proc/self/cgroup") as f:
        lines = [ln.rstrip("\n").split(":", 2) for ln in f]
    if mgr.version == 2:
        assert mgr.path == next(p for h, _, p in lines if h == "0")
    else:
        mem = next((p for h, c, p in lines if "memory" in c.split(",")), None)
        if mem is None:
            pytest.skip("no v1 memory hierarchy")
        assert mgr.dir("memory").endswith(mem if mem != "/" else "memory")
    with pytest.raises(OSError):
        cgroup_watch.cgroup_of(2**22 + 1)      # above pid_max: no such process
