"""`husk --systemd-cgroup` on a systemd node (scripts/vm-test --node): the container's transient scope in a
nested pod slice, its unit properties and cgroup files, update, pause/resume, stats, OOM, delete, and units
systemd refuses. Containers are driven through husk's command line only, as a shim or podman would."""
from __future__ import annotations

import copy
import json
import os
import select
import shlex
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.node.conftest import node_guest
from tests.support.waiting import wait_for
from tests.vm.container import HUSK, BundleTemplate, build_template

pytestmark = [pytest.mark.node, pytest.mark.vm, pytest.mark.root,
              pytest.mark.skipif(node_guest() is not None, reason=str(node_guest()))]

MiB = 1 << 20
CGROUP = "/sys/fs/cgroup"
TIMEOUT = 120.0




def show(unit: str, *props: str) -> dict[str, str]:
    out = subprocess.run(["systemctl", "show", unit, *(f"--property={p}" for p in props)], capture_output=True,
                         text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def unit_gone(unit: str) -> bool:
    return show(unit, "LoadState", "ActiveState") in ({"LoadState": "not-found", "ActiveState": "inactive"},)


def unit_known(unit: str) -> bool:
    """Whether systemd has the unit loaded at all (`systemctl show` of a name it rejects fails)."""
    out = subprocess.run(["systemctl", "show", unit, "--property=LoadState"], capture_output=True, text=True,
                         timeout=TIMEOUT)
    return out.returncode == 0 and out.stdout.strip() not in ("LoadState=not-found", "")


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


@pytest.fixture(scope="module")
def template() -> Iterator[BundleTemplate]:
    with tempfile.TemporaryDirectory(prefix="husk-sdrt-") as d:
        yield build_template(Path(d))


class Node:
    """husk --systemd-cgroup with its own state root; every container made is deleted at the end, and the
    pod slices the test made are stopped."""

    def __init__(self, template: BundleTemplate, workdir: Path) -> None:
        self.template = template
        self.workdir = workdir
        self.root = str(workdir / "husk-root")
        self.ids: list[str] = []
        self.slices: set[str] = set()

    def husk(self, *args: str, check: bool = True, input: str | None = None,
             output: Path | None = None) -> subprocess.CompletedProcess:
        """`output`: where a created container's stdout and stderr go (they are husk's)."""
        # files, not pipes: a created container inherits stdout/stderr and would hold a pipe open
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            stdio: dict[str, Any] = {"stdout": out, "stderr": err}
            if output is not None:
                container_out = open(output, "wb")
                stdio = {"stdout": container_out, "stderr": container_out}
            try:
                p = subprocess.run([*HUSK, "--root", self.root, "--systemd-cgroup", *args], **stdio,
                                   input=input.encode() if input is not None else None, timeout=TIMEOUT,
                                   stdin=None if input is not None else subprocess.DEVNULL)
            finally:
                if output is not None:
                    container_out.close()
                    err.write(output.read_bytes())   # husk's own errors (the container has written nothing yet)
            out.seek(0)
            err.seek(0)
            cp = subprocess.CompletedProcess(p.args, p.returncode, out.read().decode(errors="replace"),
                                             err.read().decode(errors="replace"))
        if check and cp.returncode != 0:
            raise AssertionError(f"husk {shlex.join(args)} failed ({cp.returncode}): {cp.stderr.strip()}")
        return cp

    def bundle(self, cid: str, script: str, cgroups_path: str, resources: dict[str, Any]) -> Path:
        d = self.workdir / cid
        d.mkdir()
        cfg = copy.deepcopy(self.template.config)
        cfg["root"] = {"path": str(self.template.rootfs), "readonly": True}
        cfg["process"]["args"] = ["sh", "-c", script]
        cfg["process"]["terminal"] = False
        cfg["linux"]["cgroupsPath"] = cgroups_path
        cfg["linux"]["resources"] = resources
        (d / "config.json").write_text(json.dumps(cfg, indent=1))
        return d

    def create(self, script: str, resources: dict[str, Any], *, pod: str | None = None, name: str | None = None,
               check: bool = True) -> tuple[str, str, subprocess.CompletedProcess]:
        """(container id, pod slice, create's result) for a container in kubepods-burstable-pod<pod>.slice."""
        cid = f"sdrt{uuid.uuid4().hex[:10]}"
        pod = pod or uuid.uuid4().hex[:12]
        slice_ = f"kubepods-burstable-pod{pod}.slice"
        self.slices.add(slice_)
        bundle = self.bundle(cid, script, f"{slice_}:husk:{name or cid}", resources)
        self.ids.append(cid)
        return cid, slice_, self.husk("create", "--bundle", str(bundle), cid, check=check,
                                      output=self.workdir / f"{cid}.out")

    def output(self, cid: str) -> str:
        """What the container's process wrote (its stdout and stderr)."""
        path = self.workdir / f"{cid}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def record(self, cid: str) -> dict[str, Any]:
        return json.loads(Path(self.root, cid, "state.json").read_text())

    def state(self, cid: str) -> dict[str, Any]:
        return json.loads(self.husk("state", cid).stdout)

    def cleanup(self) -> None:
        for cid in self.ids:
            self.husk("delete", "--force", cid, check=False)
        for s in self.slices:
            subprocess.run(["systemctl", "stop", s], capture_output=True, timeout=TIMEOUT)


@pytest.fixture
def node(template: BundleTemplate, tmp_path: Path) -> Iterator[Node]:
    n = Node(template, tmp_path)
    yield n
    n.cleanup()


RESOURCES = {"cpu": {"shares": 512, "quota": 50000, "period": 100000},
             "memory": {"limit": 64 * MiB, "swap": 64 * MiB},
             "pids": {"limit": 32},
             "hugepageLimits": [{"pageSize": "2MB", "limit": 2 * 2 * MiB}],
             "unified": {"memory.high": str(60 * MiB)}}


def test_scope_in_a_nested_pod_slice_through_its_whole_life(node: Node) -> None:
    cid, slice_, _ = node.create("sleep 1000", RESOURCES)
    unit = f"husk-{cid}.scope"
    path = f"/kubepods.slice/kubepods-burstable.slice/{slice_}/{unit}"
    rec = node.record(cid)
    assert (rec["cgroup_path"], rec["systemd_unit"]) == (path, unit)
    node.husk("start", cid)
    pid = node.state(cid)["pid"]
    assert read(f"/proc/{pid}/cgroup") == f"0::{path}"

    # what systemd owns: the unit's properties
    p = show(unit, "CPUWeight", "CPUQuotaPerSecUSec", "MemoryMax", "MemoryHigh", "TasksMax", "Delegate", "Slice",
             "ControlGroup", "ActiveState")
    assert p == {"CPUWeight": "20", "CPUQuotaPerSecUSec": "500ms", "MemoryMax": str(64 * MiB),
                 "MemoryHigh": str(60 * MiB), "TasksMax": "32", "Delegate": "yes", "Slice": slice_,
                 "ControlGroup": path, "ActiveState": "active"}, p
    # and the files, including what systemd has no property for (hugetlb)
    d = CGROUP + path
    assert read(f"{d}/cpu.max") == "50000 100000" and read(f"{d}/cpu.weight") == "20"
    assert read(f"{d}/memory.max") == str(64 * MiB) and read(f"{d}/memory.high") == str(60 * MiB)
    assert read(f"{d}/pids.max") == "32" and read(f"{d}/hugetlb.2MB.max") == str(4 * MiB)

    # update: the unit's property and the file
    node.husk("update", "--memory", "128M", "--memory-swap", "128M", cid)
    assert read(f"{d}/memory.max") == str(128 * MiB)
    assert show(unit, "MemoryMax")["MemoryMax"] == str(128 * MiB)
    assert node.record(cid)["config"]["linux"]["resources"]["memory"]["limit"] == 128 * MiB

    # pause/resume: the freezer of the scope's cgroup
    node.husk("pause", cid)
    assert node.state(cid)["status"] == "paused" and "frozen 1" in read(f"{d}/cgroup.events")
    node.husk("resume", cid)
    assert node.state(cid)["status"] == "running" and "frozen 0" in read(f"{d}/cgroup.events")

    # stats from the scope's files
    ev = json.loads(node.husk("events", "--stats", cid).stdout)
    assert ev["type"] == "stats" and ev["id"] == cid
    assert ev["data"]["pids"]["current"] >= 1 and ev["data"]["memory"]["usage"]["usage"] > 0
    assert ev["data"]["memory"]["usage"]["limit"] == 128 * MiB
    assert pid in json.loads(node.husk("ps", "--format", "json", cid).stdout)

    # delete: no unit, no cgroup
    node.husk("kill", cid, "KILL")
    wait_for(lambda: node.state(cid)["status"] == "stopped", what="the container to stop")
    node.husk("delete", cid)
    wait_for(lambda: unit_gone(unit), what=f"{unit} to be gone")
    assert not os.path.exists(d)
    assert not os.path.exists(Path(node.root, cid))


def test_delete_force_of_a_running_container_stops_its_unit(node: Node) -> None:
    cid, slice_, _ = node.create("sleep 1000", {"pids": {"limit": 10}})
    node.husk("start", cid)
    unit = node.record(cid)["systemd_unit"]
    d = CGROUP + node.record(cid)["cgroup_path"]
    assert show(unit, "ActiveState")["ActiveState"] == "active"
    node.husk("delete", "--force", cid)
    wait_for(lambda: unit_gone(unit), what=f"{unit} to be gone")
    assert not os.path.exists(d)


def _lines(fd: int, timeout: float = TIMEOUT) -> Iterator[str]:
    """The lines written to `fd`, each waited for at most `timeout` seconds (a bound, not a measurement)."""
    buf = b""
    while True:
        while b"\n" not in buf:
            assert select.select([fd], [], [], timeout)[0], f"no line within {timeout:.0f} s"
            chunk = os.read(fd, 65536)
            assert chunk, "the stream ended"
            buf += chunk
        line, _, buf = buf.partition(b"\n")
        yield line.decode()


def test_oom_in_the_scope_is_reported(node: Node) -> None:
    # dd's 64 MB buffer does not fit in 16 MB: the OOM killer ends dd, the shell (the init) lives on
    cid, _, _ = node.create("dd if=/dev/zero of=/dev/null bs=64M count=1; echo dd-status=$?; sleep 1000",
                            {"memory": {"limit": 16 * MiB, "swap": 16 * MiB}})
    d = CGROUP + node.record(cid)["cgroup_path"]
    events = subprocess.Popen([*HUSK, "--root", node.root, "events", "--interval", "1s", cid],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    seen: list[str] = []
    try:
        assert events.stdout is not None
        lines = _lines(events.stdout.fileno())
        seen.append(json.loads(next(lines))["type"])   # the first stats line: the OOM watch is set up
        node.husk("start", cid)
        wait_for(lambda: "dd-status" in node.output(cid), TIMEOUT, "dd to end")
        assert "dd-status=137" in node.output(cid), (node.output(cid), read(f"{d}/memory.events"))
        assert int(read(f"{d}/memory.events").split("oom_kill ")[1].split()[0]) >= 1
        for line in lines:
            seen.append(json.loads(line)["type"])
            if seen[-1] == "oom":
                break
    finally:
        events.kill()           # our own `husk events`, by its pid
        events.wait()
    assert seen[0] == "stats" and seen[-1] == "oom", seen
    ev = json.loads(node.husk("events", "--stats", cid).stdout)
    assert ev["data"]["memory"]["usage"]["limit"] == 16 * MiB
    assert node.state(cid)["status"] == "running"     # the OOM kill of dd did not stop the scope


def test_a_unit_systemd_refuses_is_a_clear_error_and_leaves_nothing(node: Node) -> None:
    # the same unit name twice: systemd answers UnitExists for the second; the first is left alone
    first, slice_, _ = node.create("sleep 1000", {}, name="shared")
    node.husk("start", first)
    second, _, cp = node.create("sleep 1000", {}, pod=slice_[len("kubepods-burstable-pod"):-len(".slice")],
                                name="shared", check=False)
    assert cp.returncode == 1
    assert "husk-shared.scope" in cp.stderr and "org.freedesktop.systemd1.UnitExists" in cp.stderr, cp.stderr
    assert not os.path.exists(Path(node.root, second))
    assert show("husk-shared.scope", "ActiveState")["ActiveState"] == "active"
    assert node.state(first)["status"] == "running"
    # the refused create's runtime process (python) did not stay in the other container's scope
    for p in read(CGROUP + node.record(first)["cgroup_path"] + "/cgroup.procs").split():
        cmdline = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0]
        assert os.path.basename(cmdline) in (b"sh", b"sleep"), cmdline

    # a name systemd does not accept: its D-Bus error, no unit, no state
    bad, _, cp = node.create("sleep 1000", {}, name="bad@name", check=False)
    assert cp.returncode == 1 and "husk-bad@name.scope" in cp.stderr, cp.stderr
    assert "org.freedesktop.DBus.Error" in cp.stderr or "org.freedesktop.systemd1" in cp.stderr, cp.stderr
    assert not os.path.exists(Path(node.root, bad))
    assert not unit_known("husk-bad@name.scope")

    # a bad slice is refused before systemd is asked
    cp = node.husk("create", "--bundle", str(node.bundle("sdrtbadslice", "true", "kubepods--x.slice:husk:y", {})),
                   "sdrtbadslice", check=False)
    assert cp.returncode == 1 and "linux.cgroupsPath" in cp.stderr and "kubepods--x.slice" in cp.stderr
    assert not os.path.exists(Path(node.root, "sdrtbadslice"))
    assert [c["id"] for c in json.loads(node.husk("list", "--format", "json").stdout)] == [first]
