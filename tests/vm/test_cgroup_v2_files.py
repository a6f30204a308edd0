"""cgroup v2 only: every resource of a config.json is written to its file and reads back as the kernel shows
it; creation enables the controllers in every ancestor; updates replace values and the device program."""
from __future__ import annotations

import os

import pytest

from runtime.cgroups import bpf_devices
from runtime.cgroups.v2 import V2Manager
from runtime.errors import ConfigError, SetupError

pytestmark = [pytest.mark.vm, pytest.mark.root]

MiB = 1 << 20

RESOURCES = {
    "memory": {"limit": 96 * MiB, "swap": 128 * MiB, "reservation": 16 * MiB},
    "cpu": {"shares": 512, "quota": 50000, "period": 100000, "burst": 10000, "cpus": "0", "mems": "0"},
    "pids": {"limit": 42},
    "blockIO": {"weight": 500,
                "throttleReadBpsDevice": [{"major": 7, "minor": 0, "rate": MiB}],
                "throttleWriteIOPSDevice": [{"major": 7, "minor": 0, "rate": 120}]},
    "hugepageLimits": [{"pageSize": "2MB", "limit": 4 * MiB}],
    "unified": {"memory.high": str(80 * MiB), "memory.oom.group": "1", "memory.min": str(8 * MiB)},
    "devices": [{"allow": False, "access": "rwm"}, {"allow": True, "type": "c", "major": 1, "minor": 3,
                                                     "access": "rwm"}],
}

EXPECTED = {
    "memory.max": str(96 * MiB),
    "memory.swap.max": str(32 * MiB),
    "memory.low": str(16 * MiB),
    "memory.min": str(8 * MiB),
    "memory.high": str(80 * MiB),
    "memory.oom.group": "1",
    "cpu.weight": "20",
    "cpu.max": "50000 100000",
    "cpu.max.burst": "10000",
    "cpuset.cpus": "0",
    "cpuset.mems": "0",
    "pids.max": "42",
    "io.weight": "default 4950",
    "io.max": "7:0 rbps=1048576 wbps=max riops=max wiops=120",
    "hugetlb.2MB.max": str(4 * MiB),
    "hugetlb.2MB.rsvd.max": str(4 * MiB),
}


def read(m: V2Manager, name: str) -> str:
    with open(f"{m.dir}/{name}") as f:
        return f.read().strip()


def test_every_resource_reads_back_and_update_replaces(workload) -> None:
    w = workload(RESOURCES)
    m = w.manager
    assert isinstance(m, V2Manager)
    got = {name: read(m, name) for name in EXPECTED}
    assert got == EXPECTED
    assert len(bpf_devices.attached_program_ids(m.dir)) == 1
    assert w.call("ping") == w.pid
    assert m.pids() == [w.pid]

    # An update changes only what it names; a new device list replaces the program (still exactly one).
    m.set({"memory": {"limit": 64 * MiB}, "pids": {"limit": -1}, "cpu": {"quota": -1},
           "devices": [{"allow": True, "access": "rwm"}]})
    assert (read(m, "memory.max"), read(m, "pids.max"), read(m, "cpu.max")) == (str(64 * MiB), "max",
                                                                                 "max 100000")
    assert read(m, "memory.high") == str(80 * MiB)
    assert len(bpf_devices.attached_program_ids(m.dir)) == 1


def test_create_enables_controllers_in_every_ancestor(make_manager) -> None:
    m = make_manager("a/b/c")
    m.create()
    with open("/sys/fs/cgroup/cgroup.controllers") as f:
        all_controllers = set(f.read().split())
    parts = m.path.strip("/").split("/")
    for depth in range(1, len(parts)):
        ancestor = "/sys/fs/cgroup/" + "/".join(parts[:depth])
        with open(f"{ancestor}/cgroup.subtree_control") as f:
            assert set(f.read().split()) == all_controllers, ancestor
    assert set(read(m, "cgroup.controllers").split()) == all_controllers
    assert read(m, "cgroup.subtree_control") == ""   # the leaf holds the processes
    m.create()                                        # idempotent


def test_bad_values_are_refused_with_the_file_and_nothing_half_done(make_manager) -> None:
    m = make_manager()
    m.create()
    with pytest.raises(ConfigError):
        m.set({"unified": {"../cgroup.procs": str(os.getpid())}})
    with pytest.raises(SetupError, match="cpuset.cpus"):
        m.set({"cpu": {"cpus": "63"}})        # the guest has 2 CPUs: the kernel refuses, the error names the file
    with pytest.raises(SetupError, match="memory.nonexistent"):
        m.set({"unified": {"memory.nonexistent": "1"}})
    assert m.pids() == []


def test_stats(workload) -> None:
    w = workload({"memory": {"limit": 64 * MiB}, "pids": {"limit": 10}})
    w.call("alloc", 8 * MiB)
    st = w.manager.stats()
    assert st.cpu.usage_ns > 0 and st.cpu.user_ns + st.cpu.system_ns > 0
    assert st.memory.limit == 64 * MiB
    assert st.memory.usage > 0 and st.memory.max_usage >= 8 * MiB
    assert st.memory.rss > 0 and 0 < st.memory.working_set <= st.memory.usage
    assert "anon" in st.memory.raw
    assert (st.pids.current, st.pids.limit) == (1, 10)
    assert "2MB" in st.hugetlb


def test_hugetlb_limit_is_enforced(workload) -> None:
    with open("/proc/sys/vm/nr_hugepages") as f:
        if int(f.read()) < 2:
            pytest.skip("the guest has fewer than 2 huge pages reserved")
    w = workload({"hugepageLimits": [{"pageSize": "2MB", "limit": 2 * MiB}]})
    assert w.call("hugetlb", 2 * MiB) == 0
    assert w.call("hugetlb", 4 * MiB) != 0     # the reservation is over hugetlb.2MB.rsvd.max


def test_destroy_removes_nested_cgroups(make_manager) -> None:
    m = make_manager("parent")
    m.create()
    os.makedirs(f"{m.dir}/sub/leaf")              # e.g. what a systemd or a nested runtime inside made
    m.destroy()
    assert not m.exists() and not os.path.exists(m.dir)
