"""V2Manager on a fake cgroup tree (plain files in a temp dir): paths, stats parsing, error messages, create's
controller enabling and rollback. The real kernel behaviour is tested in the VM (tests/vm)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.cgroups.v2 import V2Manager, parse_flat_keyed, parse_nested_keyed
from runtime.errors import ConfigError, SetupError


def fake_root(tmp_path: Path, controllers: str = "cpuset cpu io memory hugetlb pids") -> Path:
    (tmp_path / "cgroup.controllers").write_text(controllers + "\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    return tmp_path


@pytest.mark.parametrize("path", ["husk/abc", "/husk/../abc", "/husk/./abc"])
def test_path_must_be_absolute_and_plain(path) -> None:
    with pytest.raises(SetupError, match="must be absolute"):
        V2Manager(path)


def test_path_is_normalised() -> None:
    m = V2Manager("//husk//abc/", mountpoint="/sys/fs/cgroup/")
    assert m.path == "/husk/abc"
    assert m.dir == "/sys/fs/cgroup/husk/abc"


def test_parsers() -> None:
    assert parse_flat_keyed("usage_usec 10\nuser_usec 7\nbogus\nx y\n") == {"usage_usec": 10, "user_usec": 7}
    assert parse_nested_keyed("8:0 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0\n7:0 rbytes=5\n") == {
        "8:0": {"rbytes": 1, "wbytes": 2, "rios": 3, "wios": 4, "dbytes": 0, "dios": 0}, "7:0": {"rbytes": 5}}


def test_stats_from_files(tmp_path: Path) -> None:
    d = tmp_path / "c"
    d.mkdir()
    files = {
        "cgroup.procs": "", "cpu.stat": "usage_usec 2000\nuser_usec 1500\nsystem_usec 500\nnr_periods 4\n"
                                        "nr_throttled 1\nthrottled_usec 30\n",
        "memory.current": "1000000\n", "memory.max": "max\n", "memory.peak": "2000000\n",
        "memory.stat": "anon 600000\nfile 300000\ninactive_file 100000\n",
        "memory.events": "low 0\nhigh 0\nmax 3\noom 2\noom_kill 1\n", "memory.swap.current": "0\n",
        "pids.current": "3\n", "pids.max": "32\n",
        "io.stat": "8:0 rbytes=10 wbytes=20 rios=1 wios=2\n8:16 rbytes=1 wbytes=2 rios=3 wios=4\n",
        "hugetlb.2MB.current": "4194304\n", "hugetlb.2MB.events": "max 5\n", "hugetlb.2MB.rsvd.current": "0\n",
    }
    for name, text in files.items():
        (d / name).write_text(text)
    st = V2Manager("/c", mountpoint=str(tmp_path)).stats()
    assert (st.cpu.usage_ns, st.cpu.user_ns, st.cpu.system_ns) == (2_000_000, 1_500_000, 500_000)
    assert (st.cpu.nr_periods, st.cpu.nr_throttled, st.cpu.throttled_ns) == (4, 1, 30_000)
    assert (st.memory.usage, st.memory.limit, st.memory.max_usage) == (1_000_000, 0, 2_000_000)
    assert (st.memory.working_set, st.memory.rss, st.memory.cache) == (900_000, 600_000, 300_000)
    assert (st.memory.oom_events, st.memory.oom_kills) == (2, 1)
    assert (st.pids.current, st.pids.limit) == (3, 32)
    assert (st.io.read_bytes, st.io.write_bytes, st.io.read_ios, st.io.write_ios) == (11, 22, 4, 6)
    assert set(st.hugetlb) == {"2MB"}
    assert (st.hugetlb["2MB"].usage, st.hugetlb["2MB"].failcnt) == (4194304, 5)
    # what `husk events` reports in runc's shape
    assert st.memory.entries["usage"].limit == 2**64 - 1 and st.memory.entries["usage"].max_usage == 2_000_000
    assert st.memory.entries["swap"].usage == 1_000_000 and st.memory.entries["swap"].limit == 2**64 - 1
    reads = [(e.major, e.minor, e.op, e.value) for e in st.io.entries["ioServiceBytesRecursive"]]
    assert reads == [(8, 0, "Read", 10), (8, 0, "Write", 20), (8, 16, "Read", 1), (8, 16, "Write", 2)]
    assert len(st.io.entries["ioServicedRecursive"]) == 4


def test_create_enables_controllers_in_ancestors_and_rolls_back(tmp_path: Path, monkeypatch) -> None:
    root = fake_root(tmp_path)
    real_mkdir, real_rmdir = os.mkdir, os.rmdir

    def mkdir(path, mode=0o777):
        # Plain directories do not grow cgroup files: add them the way the kernel would.
        if Path(path).name == "fail":
            raise PermissionError(13, "Permission denied")
        real_mkdir(path, mode)
        Path(path, "cgroup.controllers").write_text("cpu memory pids\n")
        Path(path, "cgroup.subtree_control").write_text("")

    def rmdir(path):
        # cgroupfs removes a directory that holds only its control files.
        for f in Path(path).glob("cgroup.*"):
            f.unlink()
        real_rmdir(path)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "rmdir", rmdir)
    V2Manager("/husk/a", mountpoint=str(root)).create()
    assert (root / "cgroup.subtree_control").read_text() == "+cpuset +cpu +io +memory +hugetlb +pids"
    assert (root / "husk" / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (root / "husk" / "a" / "cgroup.subtree_control").read_text() == ""   # a leaf keeps processes

    for f in root.rglob("cgroup.subtree_control"):
        f.write_text("")
    with pytest.raises(SetupError, match="mkdir .*fail"):
        V2Manager("/new/deeper/fail", mountpoint=str(root)).create()
    assert not (root / "new").exists()       # everything this create made is gone
    assert (root / "husk" / "a").is_dir()    # what existed before stays


def test_create_refuses_a_v1_mount(tmp_path: Path) -> None:
    with pytest.raises(SetupError, match="not a cgroup v2 mount"):
        V2Manager("/x", mountpoint=str(tmp_path)).create()


def test_missing_controller_file_names_the_controller(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    (root / "c").mkdir()
    (root / "c" / "cgroup.controllers").write_text("cpu pids\n")
    with pytest.raises(SetupError) as info:
        V2Manager("/c", mountpoint=str(root)).set({"memory": {"limit": 1 << 20}})
    assert "the memory controller is not enabled for /c (enabled: cpu pids)" in str(info.value)
    assert "linux.resources.memory.limit" in str(info.value)


def test_set_on_a_missing_cgroup(tmp_path: Path) -> None:
    with pytest.raises(SetupError, match="the cgroup /gone does not exist"):
        V2Manager("/gone", mountpoint=str(fake_root(tmp_path))).set({"pids": {"limit": 5}})


def test_set_writes_files(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    (root / "c").mkdir()
    for name in ("pids.max", "memory.max", "memory.low", "cpu.weight"):
        (root / "c" / name).write_text("")
    V2Manager("/c", mountpoint=str(root)).set({"pids": {"limit": 7}, "memory": {"limit": 1 << 20, "swap": -1,
                                                                                  "reservation": 4096},
                                               "cpu": {"shares": 2}})
    got = {name: (root / "c" / name).read_text() for name in ("pids.max", "memory.max", "memory.low", "cpu.weight")}
    assert got == {"pids.max": "7", "memory.max": str(1 << 20), "memory.low": "4096", "cpu.weight": "1"}
    assert not (root / "c" / "memory.swap.max").exists()   # "max" on a kernel without swap accounting: skipped


def test_destroy_of_a_missing_cgroup_is_not_an_error(tmp_path: Path) -> None:
    V2Manager("/nope", mountpoint=str(tmp_path)).destroy()
    assert not V2Manager("/nope", mountpoint=str(tmp_path)).exists()


def test_reads_of_a_missing_cgroup_name_the_file(tmp_path: Path) -> None:
    m = V2Manager("/gone", mountpoint=str(fake_root(tmp_path)))
    with pytest.raises(SetupError, match="gone/cgroup.events"):
        m.frozen()
    with pytest.raises(SetupError, match="stats of /gone"):
        m.stats()


@pytest.mark.parametrize("bad", [
    {"devices": [{"allow": "maybe"}]},                    # invalid device rule
    {"unified": {"memory.nonexistent": "1"}},              # a file the kernel does not have
])
def test_a_bad_config_writes_nothing(tmp_path: Path, bad) -> None:
    root = fake_root(tmp_path)
    (root / "c").mkdir()
    (root / "c" / "cgroup.controllers").write_text("memory pids\n")
    (root / "c" / "pids.max").write_text("max")
    with pytest.raises((SetupError, ConfigError)):
        V2Manager("/c", mountpoint=str(root)).set({"pids": {"limit": 5}, **bad})
    assert (root / "c" / "pids.max").read_text() == "max"
