"""husk containers on the host's cgroups, driven through husk's command line: every resource of a config.json reads
back the same inside the container (its view of /sys/fs/cgroup) and on the host; `husk update`, pause/resume and
delete act on the cgroup; the kernel enforces memory (OOM kill, exit 137, counted), pids (a fork bomb stops) and
device rules (the config's and the runtime's defaults). Each test is one container (Python is slow under
emulation). All run in the cgroup v2 VM and on a v1 host (cgroup_v1_too), with per-version file names."""
from __future__ import annotations

import errno
import json
import os
import select
import subprocess

import pytest

from tests.support.waiting import wait_for
from tests.vm.container import HUSK, cgroup_dirs, errno_of, host_file, host_read, ns_pid, proc_state

pytestmark = [pytest.mark.vm, pytest.mark.root, pytest.mark.cgroup_v1_too]

MiB = 1 << 20

RESOURCES_COMMON = {
    "memory": {"limit": 96 * MiB, "swap": 128 * MiB, "reservation": 16 * MiB},
    "cpu": {"shares": 512, "quota": 50000, "period": 100000, "burst": 10000, "cpus": "0", "mems": "0"},
    "pids": {"limit": 42},
    "blockIO": {"throttleReadBpsDevice": [{"major": 7, "minor": 0, "rate": MiB}],
                "throttleWriteIOPSDevice": [{"major": 7, "minor": 0, "rate": 120}]},
    "devices": [{"allow": False, "access": "rwm"}],
}
RESOURCES_V2 = {
    **RESOURCES_COMMON,
    "blockIO": {**RESOURCES_COMMON["blockIO"], "weight": 500},
    "hugepageLimits": [{"pageSize": "2MB", "limit": 4 * MiB}],
    "unified": {"memory.high": str(80 * MiB), "memory.oom.group": "1", "memory.min": str(8 * MiB)},
}
# file (as the container sees it under /sys/fs/cgroup) -> value
EXPECTED_V2 = {
    "memory.max": str(96 * MiB), "memory.swap.max": str(32 * MiB), "memory.low": str(16 * MiB),
    "memory.min": str(8 * MiB), "memory.high": str(80 * MiB), "memory.oom.group": "1",
    "cpu.weight": "20", "cpu.max": "50000 100000", "cpu.max.burst": "10000", "cpuset.cpus": "0",
    "cpuset.mems": "0", "pids.max": "42", "io.weight": "default 4950",
    "io.max": "7:0 rbps=1048576 wbps=max riops=max wiops=120",
    "hugetlb.2MB.max": str(4 * MiB), "hugetlb.2MB.rsvd.max": str(4 * MiB),
}
EXPECTED_V1 = {
    "memory/memory.limit_in_bytes": str(96 * MiB), "memory/memory.memsw.limit_in_bytes": str(128 * MiB),
    "memory/memory.soft_limit_in_bytes": str(16 * MiB), "cpu/cpu.shares": "512",
    "cpu/cpu.cfs_quota_us": "50000", "cpu/cpu.cfs_period_us": "100000", "cpu/cpu.cfs_burst_us": "10000",
    "cpuset/cpuset.cpus": "0", "cpuset/cpuset.mems": "0", "pids/pids.max": "42",
    "blkio/blkio.throttle.read_bps_device": "7:0 1048576", "blkio/blkio.throttle.write_iops_device": "7:0 120",
}
# what an update of {memory.limit 64M, pids.limit 0, cpu.quota 20000} must leave in the files
UPDATE = {"memory": {"limit": 64 * MiB}, "pids": {"limit": 0}, "cpu": {"quota": 20000}}
UPDATED_V2 = {"memory.max": str(64 * MiB), "pids.max": "42", "cpu.max": "20000 100000",
              "memory.high": str(80 * MiB), "memory.swap.max": str(32 * MiB)}
UPDATED_V1 = {"memory/memory.limit_in_bytes": str(64 * MiB), "pids/pids.max": "42",
              "cpu/cpu.cfs_quota_us": "20000", "memory/memory.memsw.limit_in_bytes": str(128 * MiB)}


def v2_or_v1(c, v2, v1):
    return v2 if c.v2 else v1


def read_inside(c, files) -> dict[str, str]:
    """Every file read by the agent in one command (the container's view of /sys/fs/cgroup)."""
    out, status = c.sh("; ".join(f"echo '== {f}'; cat /sys/fs/cgroup/{f}" for f in files))
    assert status == 0, out
    got: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        if line.startswith("== "):
            current = line[3:]
            got[current] = []
        else:
            assert current is not None, out
            got[current].append(line)
    return {f: "\n".join(lines).strip() for f, lines in got.items()}


@pytest.mark.parametrize("cgroupns", [True, False], ids=["cgroupns", "host-cgroupns"])
def test_resources_inside_and_on_the_host(container, cgroup_version, cgroupns) -> None:
    resources = RESOURCES_V2 if cgroup_version == 2 else RESOURCES_COMMON
    c = container(resources, cgroupns=cgroupns)
    m = c.manager
    expected = v2_or_v1(c, EXPECTED_V2, EXPECTED_V1)
    assert {f: host_read(m, f) for f in expected} == expected
    assert read_inside(c, expected) == expected

    # The container's /sys/fs/cgroup is its own cgroup, read-only; /proc/self/cgroup names it relative to the
    # cgroup namespace's root (its own cgroup) or, without one, by its host path.
    own = "/" if cgroupns else m.path
    cg_lines = c.call("cat", "/proc/self/cgroup").splitlines()
    if c.v2:
        assert cg_lines == [f"0::{own}"]
    else:
        assert [ln.split(":", 2)[2] for ln in cg_lines if ln.split(":")[1] == "memory"] == [own]
    pids_file = v2_or_v1(c, "pids.max", "pids/pids.max")
    out, status = c.sh(f"echo 7 > /sys/fs/cgroup/{pids_file}")
    assert status != 0 and errno_of(out) == errno.EROFS, out
    assert m.pids() == [c.pid]
    assert json.loads(c.husk("ps", "--format", "json", c.id).stdout) == [c.pid]
    # husk exec joins the same cgroup (and cgroup namespace)
    assert c.husk("exec", c.id, "cat", "/proc/self/cgroup").stdout.splitlines() == cg_lines

    # the agent exits 0; with --keep the stopped container keeps its cgroup until `husk delete` removes it
    assert c.finish() == 0
    assert c.state()["status"] == "stopped"
    c.husk("delete", c.id)
    assert [d for d in cgroup_dirs(m) if os.path.exists(d)] == []
    assert c.husk("state", c.id, check=False).returncode != 0


def test_update_pause_resume(container, cgroup_version) -> None:
    c = container(RESOURCES_V2 if cgroup_version == 2 else RESOURCES_COMMON)
    m = c.manager
    pids_file = v2_or_v1(c, "pids.max", "pids/pids.max")
    # husk update: what it names changes, the rest stays; pids.limit 0 leaves pids.max alone (runc 1.1.5)
    c.husk("update", "--resources", "-", c.id, input=json.dumps(UPDATE))
    updated = v2_or_v1(c, UPDATED_V2, UPDATED_V1)
    assert {f: host_read(m, f) for f in updated} == updated
    assert read_inside(c, updated) == updated
    c.husk("update", "--resources", "-", c.id, input=json.dumps({"pids": {"limit": -1}}))
    assert host_read(m, pids_file) == "max" and c.call("cat", f"/sys/fs/cgroup/{pids_file}") == "max"

    # husk pause freezes every process (a busy loop included), resume thaws them
    spinner_ns = c.call("spawn", "spin")
    spinner = next(p for p in m.pids() if p != c.pid and ns_pid(p) == spinner_ns)
    assert proc_state(spinner) == "R"                     # a busy loop is always runnable
    c.husk("pause", c.id)
    assert c.state()["status"] == "paused"
    assert m.frozen()
    if c.v2:
        assert "frozen 1" in host_read(m, "cgroup.events").splitlines()
    else:
        assert host_read(m, "freezer/freezer.state") == "FROZEN"
    states = {p: proc_state(p) for p in m.pids()}
    assert set(states) == {c.pid, spinner}
    assert all(s in ("S", "D", "T") for s in states.values()), states   # v2 parks frozen tasks in S, v1 in D
    c.husk("resume", c.id)
    assert c.state()["status"] == "running" and not m.frozen()
    assert c.call("ping") == 1
    assert proc_state(spinner) in ("R", "S")
    st = m.stats()
    assert st.pids.current == 2 and st.memory.usage > 0 and st.cpu.usage_ns > 0


def _with_mknod(cfg) -> None:
    for kind in ("bounding", "effective", "permitted"):
        cfg["process"]["capabilities"][kind].append("CAP_MKNOD")


def test_device_rules_defaults_and_fork_bomb(container) -> None:
    rules = [{"allow": False, "access": "rwm"},
             {"allow": True, "type": "b", "major": 7, "minor": 0, "access": "r"},      # loop0, read only
             {"allow": True, "type": "c", "major": 10, "minor": 237, "access": "r"}]   # loop-control, read only
    c = container({"devices": rules, "pids": {"limit": 8}}, edit=_with_mknod)
    # the runtime's defaults, after the config's deny-all: the standard nodes, the pty, mknod of anything
    for dev in ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/ptmx"):
        assert c.call("open", dev, "rw") == 0, dev
    assert c.call("open", "/dev/tty", "rw") in (0, errno.ENXIO)     # allowed; no controlling terminal: ENXIO
    for name, kind, major, minor in (("mem", "c", 1, 1), ("loop0", "b", 7, 0), ("loop1", "b", 7, 1),
                                     ("loopctl", "c", 10, 237)):
        assert c.call("mknod", f"/dev/vmct-{name}", kind, major, minor) == 0, name
    # the config's rules: only what they allow opens; the denial is the cgroup's (EPERM), not the driver's
    assert c.call("open", "/dev/vmct-loop0", "r") == 0
    assert c.call("open", "/dev/vmct-loop0", "w") == errno.EPERM
    assert c.call("open", "/dev/vmct-loop0", "rw") == errno.EPERM
    assert c.call("open", "/dev/vmct-loop1", "r") == errno.EPERM
    assert c.call("open", "/dev/vmct-loopctl", "r") == 0
    assert c.call("open", "/dev/vmct-loopctl", "w") == errno.EPERM
    assert c.call("open", "/dev/vmct-mem", "r") == errno.EPERM

    # pids.max 8: the agent and the forking subshell leave room for 6 sleepers; the 7th fork fails
    m = c.manager
    assert c.call("fork", 20) == [6, errno.EAGAIN]
    events = host_read(m, v2_or_v1(c, "pids.events", "pids/pids.events"))
    assert int(dict(ln.split() for ln in events.splitlines())["max"]) >= 1
    assert c.call("fork", 3) == [3, 0]                     # the ended sleepers gave their slots back

    # kill --all reaches every process in the cgroup (v2: cgroup.kill), the init included
    c.call("spawn", "sleep")
    assert len(m.pids()) == 2
    c.husk("kill", "--all", c.id, "KILL")
    assert c.exit_code() == 137
    # the helper may be reaped a moment after the init
    wait_for(lambda: m.pids() == [], 30, lambda: f"no process left, have {m.pids()}")


def test_memory_oom_kill_counted_exit_137_and_delete(container) -> None:
    c = container({"memory": {"limit": 48 * MiB, "swap": 48 * MiB}, "pids": {"limit": 0}})
    m = c.manager
    pids_file = v2_or_v1(c, "pids.max", "pids/pids.max")
    assert host_read(m, pids_file) == "max"                 # pids.limit 0: left alone (runc 1.1.5)
    assert c.call("alloc", 8 * MiB) == 0
    assert c.call("alloc", 128 * MiB) == 137                # a child over memory.max: OOM-killed, agent lives
    assert m.stats().memory.oom_kills == 1
    events_file = v2_or_v1(c, "memory.events", "memory/memory.oom_control")
    assert "oom_kill 1" in c.call("cat", f"/sys/fs/cgroup/{events_file}").splitlines()
    assert c.call("ping") == 1
    c.exec_alloc(128 * MiB)                                 # now the init itself
    assert c.exit_code() == 137
    assert m.stats().memory.oom_kills == 2
    assert "oom_kill 2" in host_read(m, events_file).splitlines()
    assert c.state()["status"] == "stopped"
    c.husk("delete", c.id)
    assert [d for d in cgroup_dirs(m) if os.path.exists(d)] == []


def test_update_with_runc_flags(container) -> None:
    c = container({"memory": {"limit": 96 * MiB}, "pids": {"limit": 42}})
    m = c.manager
    pids_file = v2_or_v1(c, "pids.max", "pids/pids.max")
    memory_file = v2_or_v1(c, "memory.max", "memory/memory.limit_in_bytes")
    c.husk("update", "--pids-limit", "0", c.id)
    assert host_read(m, pids_file) == "42"
    c.husk("update", "--pids-limit", "20", "--memory", str(64 * MiB), c.id)
    assert (host_read(m, pids_file), host_read(m, memory_file)) == ("20", str(64 * MiB))
    assert c.call("cat", f"/sys/fs/cgroup/{pids_file}") == "20"
    c.husk("update", "--pids-limit", "-1", c.id)
    assert host_read(m, pids_file) == "max"


def _with_userns(cfg) -> None:
    linux = cfg["linux"]
    linux["namespaces"].append({"type": "user"})
    linux["uidMappings"] = [{"containerID": 0, "hostID": 100000, "size": 65536}]
    linux["gidMappings"] = [{"containerID": 0, "hostID": 100000, "size": 65536}]


@pytest.mark.parametrize("cgroupns", [True, False], ids=["cgroupns", "host-cgroupns"])
def test_user_namespace_sees_its_own_cgroup(container, cgroup_version, cgroupns) -> None:
    """In a user namespace the kernel mounts cgroup2 only for a cgroup namespace the user namespace owns; without
    one the runtime binds the container's cgroup. Either way the container sees its own limits, read-only."""
    if cgroup_version == 1:
        pytest.skip("cgroup v2 only: the cgroup2 mount in a user namespace")
    c = container({"pids": {"limit": 42}, "memory": {"limit": 96 * MiB}}, cgroupns=cgroupns, edit=_with_userns)
    assert read_inside(c, ["pids.max", "memory.max"]) == {"pids.max": "42", "memory.max": str(96 * MiB)}
    assert c.call("cat", "/proc/self/cgroup") == f"0::{'/' if cgroupns else c.manager.path}"
    out, status = c.sh("echo 7 > /sys/fs/cgroup/pids.max")
    assert status != 0 and errno_of(out) == errno.EROFS, out
    assert c.finish() == 0


def test_events_stats_and_oom(container) -> None:
    c = container({"memory": {"limit": 48 * MiB, "swap": 48 * MiB}, "pids": {"limit": 42}})
    ev = json.loads(c.husk("events", "--stats", c.id).stdout)
    assert (ev["type"], ev["id"]) == ("stats", c.id)
    data = ev["data"]
    assert data["pids"] == {"current": 1, "limit": 42}
    assert data["memory"]["usage"]["limit"] == 48 * MiB and data["memory"]["usage"]["usage"] > 0
    assert data["cpu"]["usage"]["total"] > 0

    # a running `husk events` reports the OOM kill of a process in the container. Its first stats line says it
    # is watching (the OOM watch is set up before the first interval).
    with open(os.devnull, "rb") as devnull:
        watcher = subprocess.Popen([*HUSK, "--root", c.root, "events", "--interval", "1s", c.id],
                                   stdin=devnull, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert watcher.stdout is not None
    seen: list[str] = []
    try:
        lines = _lines(watcher.stdout.fileno())
        seen.append(json.loads(next(lines))["type"])
        assert c.call("alloc", 128 * MiB) == 137
        for line in lines:
            seen.append(json.loads(line)["type"])
            if seen[-1] == "oom":
                break
    finally:
        watcher.kill()            # our own `husk events`, by its pid
        watcher.wait()
    assert seen[0] == "stats" and seen[-1] == "oom", seen


def _lines(fd: int, timeout: float = 120.0):
    """The lines written to `fd`, each waited for at most `timeout` seconds (a bound, not a measurement)."""
    buf = b""
    while True:
        while b"\n" not in buf:
            ready, _, _ = select.select([fd], [], [], timeout)
            assert ready, f"no line within {timeout:.0f} s"
            chunk = os.read(fd, 65536)
            assert chunk, "the stream ended"
            buf += chunk
        line, _, buf = buf.partition(b"\n")
        yield line.decode()
