"""husk-cri's own reading of a task's cgroup counters for the stats RPCs (cri_server/rpc/cgread.py): on fake v1
and v2 cgroup directories it gives the stats RPCs the same figures as the shim's full reading
(shim/cgroup_watch.py over runtime.cgroups); a pid whose cgroup does not name the object is not read; the stats
RPCs use the reading and ask the shim only when there is none."""
from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

from cri_server.rpc import cgread, stats
from cri_server.store.records import ContainerRecord, ContainerState
from runtime.cgroups.v1 import V1Manager
from runtime.cgroups.v2 import V2Manager
from shim import cgroup_watch

CID = "c0ffee" * 4

V1_MEMSTAT = """cache 4096
rss 8192
mapped_file 1024
pgfault 10
pgmajfault 1
inactive_file 2048
total_cache 40960
total_rss 81920
total_mapped_file 10240
total_pgfault 100
total_pgmajfault 3
total_inactive_file 20480
total_active_file 100
"""
V2_MEMSTAT = """anon 81920
file 40960
file_mapped 10240
pgfault 100
pgmajfault 3
inactive_file 20480
active_file 100
"""


def _write(d, files: dict[str, str]) -> None:
    os.makedirs(d, exist_ok=True)
    for name, text in files.items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)


def _same_for_stats(full, lean) -> None:
    """What the stats RPCs take from a reading (stats.memory_of, cpu total, pids) is equal."""
    a, b = stats.memory_of(full), stats.memory_of(lean)
    for k in ("usage", "working_set", "limit", "rss", "cache", "mapped_file", "page_faults", "major_page_faults",
              "swap", "swap_limit", "available", "swap_available"):
        assert getattr(a, k) == getattr(b, k), k
    assert full.cpu.usage.total == lean.cpu.usage.total
    assert full.pids.current == lean.pids.current


def test_v1_reading_matches_the_shims(tmp_path):
    root = tmp_path / "v1"
    hier = {c: str(root / c) for c in ("cpuacct", "memory", "pids")}
    _write(root / "cpuacct" / "pods" / CID, {"cpuacct.usage": "123456789\n"})
    mem = {"memory.stat": V1_MEMSTAT, "memory.usage_in_bytes": "300000\n", "memory.limit_in_bytes": "1048576\n",
           "memory.memsw.usage_in_bytes": "310000\n", "memory.memsw.limit_in_bytes": "2097152\n"}
    _write(root / "memory" / "pods" / CID, mem)
    _write(root / "pids" / "pods" / CID, {"pids.current": "4\n", "pids.max": "max\n"})
    cg = V1Manager(f"/pods/{CID}", hier=hier)
    _same_for_stats(cgroup_watch.metrics(cg), cgread.read(cg))
    # No limit (the kernel's ~2^63) and no swap accounting.
    mem["memory.limit_in_bytes"] = "9223372036854771712\n"
    _write(root / "memory" / "pods" / CID, mem)
    for name in ("memory.memsw.usage_in_bytes", "memory.memsw.limit_in_bytes"):
        os.unlink(root / "memory" / "pods" / CID / name)
    lean = cgread.read(cg)
    _same_for_stats(cgroup_watch.metrics(cg), lean)
    assert stats.memory_of(lean).limit == 0 and stats.memory_of(lean).swap is None


def test_v2_reading_matches_the_shims(tmp_path):
    d = tmp_path / "v2" / "pods" / CID
    files = {"cpu.stat": "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\n", "memory.stat": V2_MEMSTAT,
             "memory.current": "300000\n", "memory.max": "1048576\n", "memory.events": "oom 0\noom_kill 0\n",
             "memory.swap.current": "10000\n", "memory.swap.max": "1048576\n", "pids.current": "4\n",
             "pids.max": "max\n"}
    _write(d, files)
    cg = V2Manager(f"/pods/{CID}", mountpoint=str(tmp_path / "v2"))
    _same_for_stats(cgroup_watch.metrics(cg), cgread.read(cg))
    files["memory.max"] = "max\n"
    files["memory.swap.max"] = "max\n"
    _write(d, files)
    lean = cgread.read(cg)
    _same_for_stats(cgroup_watch.metrics(cg), lean)
    assert stats.memory_of(lean).limit == 0


def test_a_gone_cgroup_reads_as_none(tmp_path):
    hier = {c: str(tmp_path / "v1" / c) for c in ("cpuacct", "memory", "pids")}
    assert cgread.read(V1Manager(f"/pods/{CID}", hier=hier)) is None
    assert cgread.read(V2Manager(f"/pods/{CID}", mountpoint=str(tmp_path / "v2"))) is None


def test_only_a_cgroup_naming_the_object_is_located():
    assert cgread.locate(os.getpid(), "0123456789abcdef-not-this-process") is None
    assert cgread.locate(0, CID) is None
    assert cgread.locate(2**22 + 12345, CID) is None     # no such process (above pid_max's default)


def test_stats_read_the_cgroup_and_ask_the_shim_only_without_it(tmp_path, monkeypatch):
    d = tmp_path / "v2" / CID
    _write(d, {"cpu.stat": "usage_usec 5\n", "memory.stat": V2_MEMSTAT, "memory.current": "300000\n",
               "memory.max": "max\n", "pids.current": "2\n"})
    located: list[tuple[int, str]] = []

    def locate(pid, object_id):
        located.append((pid, object_id))
        return V2Manager(f"/{CID}", mountpoint=str(tmp_path / "v2")) if pid == 77 else None
    monkeypatch.setattr(cgread, "locate", locate)
    asked: list[str] = []

    class Shims:
        async def call(self, object_id, address, method, timeout=None, **kw):
            asked.append(object_id)
            from cri_server.shims import ShimGone
            raise ShimGone(object_id)

    class Store:             # rpc/stats.py keeps its readings per store (weakly)
        pass
    svc = SimpleNamespace(store=Store(), images=None, need_shims=lambda: Shims())
    rec = ContainerRecord(id=CID, sandbox_id="sb", name="n", container_name="c", attempt=0,
                          state=ContainerState.RUNNING, created_at=1, image="i", image_ref="sha256:aa",
                          shim_address="unix:///s/x", pid=77)

    async def go():
        first = await stats.sample_container(svc, rec)
        _write(d, {"cpu.stat": "usage_usec 6\n"})
        again = await stats.sample_container(svc, rec)          # younger than _READING_MAX_AGE_NS
        monkeypatch.setattr(stats, "_READING_MAX_AGE_NS", 0)
        newer = await stats.sample_container(svc, rec)
        other = await stats.sample_container(svc, ContainerRecord(**{**rec.__dict__, "pid": 78}))
        return first, again, newer, other
    first, again, newer, other = asyncio.run(go())
    assert first.metrics.cpu.usage.total == 5000 and first.metrics.pids.current == 2
    assert first.metrics.memory.usage.usage == 300000
    assert again.metrics is first.metrics and again.now == first.now
    assert newer.metrics.cpu.usage.total == 6000 and newer.now > first.now
    assert located == [(77, CID), (78, CID)]          # located once per pid
    assert asked == [CID] and other.metrics is None    # no cgroup for pid 78: the shim was asked
