"""OCI linux.resources -> cgroup v2 writes: conversions (runc's), validation, and what is left alone."""
from __future__ import annotations

import pytest

from runtime.cgroups import v2_resources as v2r
from runtime.cgroups.v2_resources import Write
from runtime.errors import ConfigError


def writes(resources, files=()) -> list[tuple[str, str]]:
    return [(w.file, w.value) for w in v2r.plan(resources, lambda name: name in files)]


@pytest.mark.parametrize("shares,weight", [(2, 1), (1024, 39), (262144, 10000), (1, 1), (10**9, 10000),
                                           (512, 20), (100, 4)])
def test_cpu_shares_to_weight_is_runcs(shares, weight) -> None:
    assert v2r.cpu_shares_to_weight(shares) == weight


@pytest.mark.parametrize("blkio,io", [(10, 1), (1000, 10000), (500, 4950), (100, 910)])
def test_blkio_weight_conversion(blkio, io) -> None:
    assert v2r.blkio_weight_to_io_weight(blkio) == io


@pytest.mark.parametrize("swap,memory,expected", [
    (0, -1, -1),                 # unlimited memory, swap unset: unlimited swap too
    (-1, 100, -1),
    (0, 100, 0),                 # unset
    (300, 100, 200),             # memory+swap -> swap only
    (100, 100, 0),
])
def test_swap_conversion(swap, memory, expected) -> None:
    assert v2r.swap_max(swap, memory) == expected


def test_swap_without_memory_limit_is_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        v2r.plan({"memory": {"swap": 200}}, lambda n: True)
    assert info.value.path == "linux.resources.memory.swap"


def test_swap_below_memory_is_rejected() -> None:
    with pytest.raises(ConfigError, match="must not be below"):
        v2r.plan({"memory": {"limit": 200, "swap": 100}}, lambda n: True)


def test_memory_fields() -> None:
    assert writes({"memory": {"limit": 64 << 20, "swap": 96 << 20, "reservation": 32 << 20}}) == [
        ("memory.swap.max", str(32 << 20)), ("memory.max", str(64 << 20)), ("memory.low", str(32 << 20))]
    assert writes({"memory": {"limit": 100, "swap": 100}}) == [("memory.swap.max", "0"), ("memory.max", "100")]
    assert writes({"memory": {"limit": -1}}) == [("memory.swap.max", "max"), ("memory.max", "max")]
    assert writes({"memory": {"limit": 0, "swappiness": 10, "kernel": 5}}) == []


def test_unlimited_swap_may_be_missing_but_a_real_swap_limit_may_not() -> None:
    (w,) = v2r.plan({"memory": {"swap": -1}}, lambda n: False)
    assert w == Write("memory.swap.max", "max", "linux.resources.memory.swap", missing_ok=True)
    w = v2r.plan({"memory": {"limit": 100, "swap": 300}}, lambda n: False)[0]
    assert w.file == "memory.swap.max" and not w.missing_ok


def test_cpu_fields() -> None:
    assert writes({"cpu": {"shares": 1024, "quota": 50000, "period": 100000, "cpus": "0-1", "mems": "0"}}) == [
        ("cpu.weight", "39"), ("cpu.max", "50000 100000"), ("cpuset.cpus", "0-1"), ("cpuset.mems", "0")]
    assert writes({"cpu": {"quota": -1}}) == [("cpu.max", "max")]
    assert writes({"cpu": {"period": 20000}}) == [("cpu.max", "max 20000")]
    assert writes({"cpu": {"burst": 1000, "idle": 1}}) == [("cpu.idle", "1"), ("cpu.max.burst", "1000")]
    assert writes({"cpu": {"shares": 0, "cpus": ""}}) == []


def test_realtime_cpu_is_refused() -> None:
    with pytest.raises(ConfigError, match="real-time"):
        v2r.plan({"cpu": {"realtimeRuntime": 950000}}, lambda n: True)


def test_cpuset_syntax_is_checked() -> None:
    with pytest.raises(ConfigError) as info:
        v2r.plan({"cpu": {"cpus": "0-1\nmax"}}, lambda n: True)
    assert info.value.path == "linux.resources.cpu.cpus"


def test_pids() -> None:
    assert writes({"pids": {"limit": 32}}) == [("pids.max", "32")]
    assert writes({"pids": {"limit": -1}}) == [("pids.max", "max")]
    assert writes({"pids": {"limit": 0}}) == []      # runc 1.1.5: 0 leaves pids.max alone


def test_pids_below_minus_one_is_refused_before_any_write() -> None:
    # runc 1.1.5 writes "-2" and the kernel refuses it; husk names the field instead
    with pytest.raises(ConfigError) as info:
        v2r.plan({"memory": {"limit": 1 << 20}, "pids": {"limit": -2}}, lambda n: True)
    assert info.value.path == "linux.resources.pids.limit"


def test_block_io_without_and_with_bfq() -> None:
    bio = {"weight": 500, "weightDevice": [{"major": 8, "minor": 0, "weight": 100}],
           "throttleReadBpsDevice": [{"major": 8, "minor": 0, "rate": 1048576}],
           "throttleWriteIOPSDevice": [{"major": 8, "minor": 16, "rate": 0}]}
    assert writes({"blockIO": bio}) == [
        ("io.weight", "4950"), ("io.weight", "8:0 910"), ("io.max", "8:0 rbps=1048576"), ("io.max", "8:16 wiops=max")]
    assert writes({"blockIO": bio}, files={"io.bfq.weight"})[:2] == [("io.bfq.weight", "500"),
                                                                     ("io.bfq.weight", "8:0 100")]


def test_block_io_weight_range() -> None:
    with pytest.raises(ConfigError) as info:
        v2r.plan({"blockIO": {"weight": 5}}, lambda n: False)
    assert info.value.path == "linux.resources.blockIO.weight"
    with pytest.raises(ConfigError) as info:
        v2r.plan({"blockIO": {"throttleReadBpsDevice": [{"major": 8, "rate": 1}]}}, lambda n: False)
    assert info.value.path == "linux.resources.blockIO.throttleReadBpsDevice[0]"


def test_hugetlb() -> None:
    assert writes({"hugepageLimits": [{"pageSize": "2MB", "limit": 4 << 21}]}, files={"hugetlb.2MB.max"}) == [
        ("hugetlb.2MB.max", str(4 << 21))]
    assert writes({"hugepageLimits": [{"pageSize": "2MB", "limit": 0}]},
                  files={"hugetlb.2MB.max", "hugetlb.2MB.rsvd.max"}) == [
        ("hugetlb.2MB.max", "0"), ("hugetlb.2MB.rsvd.max", "0")]
    with pytest.raises(ConfigError, match="no 1GB huge pages"):
        v2r.plan({"hugepageLimits": [{"pageSize": "1GB", "limit": 0}]}, lambda n: n == "hugetlb.2MB.max")
    with pytest.raises(ConfigError) as info:
        v2r.plan({"hugepageLimits": [{"pageSize": "../2MB", "limit": 0}]}, lambda n: True)
    assert info.value.path == "linux.resources.hugepageLimits[0].pageSize"


def test_rdma() -> None:
    assert writes({"rdma": {"mlx5_1": {"hcaHandles": 3, "hcaObjects": 10000}, "mlx4_0": {"hcaObjects": 5}}}) == [
        ("rdma.max", "mlx4_0 hca_object=5"), ("rdma.max", "mlx5_1 hca_handle=3 hca_object=10000")]


def test_network_is_refused_only_when_it_asks_for_something() -> None:
    assert writes({"network": {}}) == []
    with pytest.raises(ConfigError, match="net_cls"):
        v2r.plan({"network": {"classID": 1048577}}, lambda n: True)


def test_unified_comes_last_and_wins() -> None:
    assert writes({"unified": {"memory.max": "1G", "memory.oom.group": "1"}, "memory": {"limit": 100}}) == [
        ("memory.max", "100"), ("memory.max", "1G"), ("memory.oom.group", "1")]


@pytest.mark.parametrize("key", ["../cgroup.procs", "memory/../../x", "..", ".", ".hidden", "", "cgroup.procs",
                                 "cgroup.kill", "cgroup.freeze", "cgroup.threads", "memoryhigh", "a\0b"])
def test_unified_keys_cannot_escape_or_move_processes(key) -> None:
    with pytest.raises(ConfigError) as info:
        v2r.plan({"unified": {key: "1"}}, lambda n: True)
    assert info.value.path.startswith("linux.resources.unified")


def test_unified_values_are_strings() -> None:
    with pytest.raises(ConfigError) as info:
        v2r.plan({"unified": {"memory.high": 5}}, lambda n: True)
    assert info.value.path == "linux.resources.unified.memory.high"


def test_wrong_types_name_the_field() -> None:
    with pytest.raises(ConfigError) as info:
        v2r.plan({"memory": {"limit": "1G"}}, lambda n: True)
    assert info.value.path == "linux.resources.memory.limit"
    with pytest.raises(ConfigError) as info:
        v2r.plan({"cpu": []}, lambda n: True)
    assert info.value.path == "linux.resources.cpu"
    with pytest.raises(ConfigError) as info:
        v2r.plan({"pids": {"limit": True}}, lambda n: True)
    assert info.value.path == "linux.resources.pids.limit"


def test_empty_resources_write_nothing() -> None:
    assert writes({}) == []
