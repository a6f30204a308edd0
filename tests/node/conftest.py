"""Fixtures for the node suite (tests/node): husk-cri end to end in the `scripts/vm-test --node` guest, where
systemd is PID 1 on cgroup v2 only (see tests/node/README.md). Everything here is skipped anywhere else
(node_guest() says why).

- `node_images`: the test images (busybox, the pause image) built once per session as OCI layouts with the
  project's own builder (cri_server.images.testimages) in the guest's /tmp, imported into each husk-cri's store.
- `node_network`: a CNI bridge network (bridge + host-local; husk-cri brings `lo` up itself) on 10.88.0.0/16,
  written into the guest's /etc/cni/net.d: the guest has no NIC, so the network exists only inside it.
- `node_cri`: husk-cri run by systemd as husk-cri.service, installed by `husk-cri setup --systemd-unit` (the
  contrib unit with this install's ExecStart, checked; a drop-in adds only the log file and Restart=no), once per
  cgroup driver: "cgroupfs" and "systemd".
- `qos_parent`: a pod's cgroup parent made as kubelet makes it for that driver; afterwards every pod of the
  daemon is stopped and removed, then the parents are removed.
A failed test's report carries the end of husk-cri's log and systemd's journal (the guest is gone afterwards).
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.cri import CriDaemon
from tests.support.waiting import wait_for

TOP = Path(__file__).resolve().parents[2]
CGROUP = "/sys/fs/cgroup"
DRIVERS = ("cgroupfs", "systemd")
UNIT = "husk-cri.service"
CONTRIB_UNIT = TOP / "contrib" / "systemd" / "husk-cri.service"
UNIT_DIR = "/run/systemd/system"        # the guest's runtime unit dir: gone with the guest
SANDBOX_IMAGE = "registry.k8s.io/pause:3.9-husk"
BUSYBOX = "docker.io/library/busybox:latest"
CNI_CONF_DIR = "/etc/cni/net.d"
CNI_BIN_DIR = "/usr/lib/cni"
BRIDGE = "husknode0"
SUBNET = "10.88.0.0/16"
QOS_CONTROLLERS = ("cpu", "cpuset", "io", "memory", "pids", "hugetlb")


def node_guest() -> str | None:
    """Why this is not a node-shaped machine (None when it is): root, systemd as PID 1, cgroup2 alone on
    /sys/fs/cgroup with the memory and pids controllers, the system bus."""
    if os.geteuid() != 0:
        return "needs root"
    try:
        with open("/proc/1/comm") as f:
            if f.read().strip() != "systemd":
                return "PID 1 is not systemd: run scripts/vm-test --node"
        with open(f"{CGROUP}/cgroup.controllers") as f:
            if not {"memory", "pids"} <= set(f.read().split()):
                return f"{CGROUP} lacks the memory and pids controllers"
    except OSError as e:
        return f"not a cgroup v2 systemd node ({e.filename}: {e.strerror}): run scripts/vm-test --node"
    if not os.path.exists("/run/dbus/system_bus_socket"):
        return "no system bus (/run/dbus/system_bus_socket)"
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "node: runs only on a systemd cgroup v2 node (scripts/vm-test --node)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = node_guest()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("node") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test shows the end of its husk-cri's log and of the journal: the guest is gone afterwards."""
    outcome = yield
    report = outcome.get_result()
    d = getattr(item, "funcargs", {}).get("node_cri")
    if report.failed and d is not None:
        report.sections.append((f"husk-cri log ({d.driver}), last 6000 chars", d.log()[-6000:]))
        journal = run("journalctl", "--no-pager", "-n", "40", "_PID=1", check=False)   # systemd's own words
        report.sections.append(("journalctl -n 40 _PID=1", journal.stdout))


# --- commands ---------------------------------------------------------------------------------------------------
def run(*argv: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")
    return p


def unit_property(unit: str, prop: str) -> str:
    return run("systemctl", "show", "--value", "-p", prop, unit).stdout.strip()


def start_transient_slice(name: str, properties: dict[str, tuple[str, Any]] | None = None) -> None:
    """A transient slice as kubelet's systemd cgroup manager makes one: StartTransientUnit over D-Bus, no default
    dependencies, accounting on (so systemd enables the controllers below it), plus `properties`
    (name -> (D-Bus signature, value))."""
    props: dict[str, tuple[str, Any]] = {
        "Description": ("s", f"kubelet-style slice {name}"), "DefaultDependencies": ("b", "false"),
        "MemoryAccounting": ("b", "true"), "CPUAccounting": ("b", "true"), "TasksAccounting": ("b", "true"),
        "IOAccounting": ("b", "true")}
    props.update(properties or {})
    args: list[str] = []
    for key, (sig, value) in props.items():
        args += [key, sig, str(value)]
    run("busctl", "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager", "StartTransientUnit", "ssa(sv)a(sa(sv))", name, "fail",
        str(len(props)), *args, "0")
    wait_for(lambda: unit_property(name, "ActiveState") == "active", 60, f"{name} to be active")


def stop_unit(name: str) -> None:
    run("systemctl", "stop", name, check=False)
    run("systemctl", "reset-failed", name, check=False)


def cgroup_of(pid: int) -> str:
    """The unified cgroup of `pid`, relative to /sys/fs/cgroup (the "0::" line)."""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].strip()
    raise AssertionError(f"/proc/{pid}/cgroup has no unified (0::) line")


def read_cg(path: str, name: str) -> str:
    with open(os.path.join(CGROUP, path.lstrip("/"), name)) as f:
        return f.read().strip()


def enable_controllers(path: str) -> None:
    """As libcontainer's cgroupfs manager does for a parent: every available controller for the children."""
    base = os.path.join(CGROUP, path.lstrip("/"))
    with open(os.path.join(base, "cgroup.controllers")) as f:
        have = set(f.read().split())
    wanted = " ".join(f"+{c}" for c in QOS_CONTROLLERS if c in have)
    if wanted:
        with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
            f.write(wanted)


# --- images and network -------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def node_images() -> Iterator[dict[str, str]]:
    """Image reference -> OCI layout directory, built here (no registry: the guest has no network)."""
    from cri_server.images import testimages
    out = tempfile.mkdtemp(prefix="husk-node-images-")
    try:
        index = testimages.build(out, only=["busybox", "pause-sandbox"], big=False, log=lambda *_: None)
        yield {BUSYBOX: os.path.join(out, index["busybox"]["layout"]),
               SANDBOX_IMAGE: os.path.join(out, index["pause-sandbox"]["layout"])}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def import_images(root: str, images: dict[str, str]) -> None:
    from cri_server.images.service import ImageService

    async def go() -> None:
        svc = ImageService(root, None)
        try:
            for ref, layout in images.items():
                await svc.import_archive(layout, [ref])
        finally:
            await svc.close()
    asyncio.run(go())


@dataclass
class NodeNetwork:
    """The guest's pod network: what CriDaemon needs of a network (conf_dir), and a cleanup."""
    conf_dir: str = CNI_CONF_DIR
    bridge: str = BRIDGE
    subnet: str = SUBNET
    ipam_dir: str = "/var/lib/husk/node-cni"
    written: list[str] = field(default_factory=list)

    def write(self) -> None:
        from cri_server.network.defaults import default_conflist, loopback_conf
        doc = default_conflist(bridge=self.bridge, subnet=self.subnet, network="husk-node", data_dir=self.ipam_dir)
        # No portmap: the guest has no iptables modules, and these tests map no ports.
        doc["plugins"] = [p for p in doc["plugins"] if p["type"] == "bridge"]
        os.makedirs(self.conf_dir, exist_ok=True)
        for name, content in (("10-husk-node.conflist", doc), ("99-loopback.conf", loopback_conf())):
            path = os.path.join(self.conf_dir, name)
            with open(path, "w") as f:
                json.dump(content, f, indent=1)
            self.written.append(path)

    def cleanup(self) -> None:
        run("ip", "link", "del", self.bridge, check=False)
        for path in self.written:
            os.unlink(path)
        shutil.rmtree(self.ipam_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def node_network() -> Iterator[NodeNetwork]:
    net = NodeNetwork()
    net.write()
    yield net
    net.cleanup()


# --- husk-cri as a systemd service --------------------------------------------------------------------------------
class NodeCri(CriDaemon):
    """husk-cri run by systemd as husk-cri.service, written by `husk-cri setup --systemd-unit` with this daemon's
    config (and --systemd-cgroup for the systemd driver); a drop-in logs to `log_path` and does not restart it
    (a crash must fail the test, not be papered over)."""

    def __init__(self, base: str, network: NodeNetwork, registry_config_dir: str, driver: str) -> None:
        super().__init__(base, network, registry_config_dir, SANDBOX_IMAGE)  # type: ignore[arg-type]
        self.driver = driver
        self.husk_cri = os.path.join(os.path.dirname(sys.executable), "husk-cri")

    # --- the unit -------------------------------------------------------------------------------------
    def install_unit(self) -> None:
        """As an operator installs it: `husk-cri --config F [--systemd-cgroup] setup --systemd-unit` writes the
        unit (the contrib one with this install's ExecStart) and reloads systemd; a drop-in only adds what a
        test needs (no restart, the log file, no bytecode writes)."""
        flags = ["--config", self.config_path] + (["--systemd-cgroup"] if self.driver == "systemd" else [])
        run(self.husk_cri, *flags, "setup", "--systemd-unit", "--unit-dir", UNIT_DIR, timeout=300)
        with open(os.path.join(UNIT_DIR, UNIT)) as f:
            written = f.read()
        with open(CONTRIB_UNIT) as f:
            contrib = f.read()
        exec_start = next(ln for ln in written.splitlines() if ln.startswith("ExecStart="))
        assert exec_start.split()[0] == f"ExecStart={self.husk_cri}" and all(a in exec_start for a in flags), \
            exec_start
        # the written unit is the contrib unit but for its ExecStart
        assert [ln for ln in written.splitlines() if not ln.startswith("ExecStart=")] == \
            [ln for ln in contrib.splitlines() if not ln.startswith("ExecStart=")]
        dropin = os.path.join(UNIT_DIR, f"{UNIT}.d")
        os.makedirs(dropin, exist_ok=True)
        with open(os.path.join(dropin, "10-node-test.conf"), "w") as f:
            f.write("\n".join([
                "[Service]", "Environment=PYTHONDONTWRITEBYTECODE=1", "Restart=no",
                f"StandardOutput=append:{self.log_path}", f"StandardError=append:{self.log_path}", ""]))
        run("systemctl", "daemon-reload")

    def start(self, timeout: float = 180.0) -> None:
        # Type=notify: `systemctl start` returns once husk-cri said READY=1 (its socket accepts connections)
        p = run("systemctl", "start", UNIT, timeout=timeout, check=False)
        if p.returncode != 0 or not self._answers():
            raise RuntimeError(f"systemctl start {UNIT}: exit {p.returncode} {p.stderr.strip()}\n"
                               f"{self.log()[-3000:]}")

    def active(self) -> bool:
        return unit_property(UNIT, "ActiveState") == "active"

    def main_pid(self) -> int:
        return int(unit_property(UNIT, "MainPID") or 0)

    def stop(self) -> None:
        self._close_channel()
        run("systemctl", "stop", UNIT, timeout=120, check=False)

    def kill9(self) -> None:
        self._close_channel()
        run("systemctl", "kill", "--kill-who=main", "-s", "KILL", UNIT, check=False)
        wait_for(lambda: not self.active(), 60, "husk-cri to die")

    def remove_all_pods(self) -> None:
        from cri_server.api.v1 import api_pb2 as pb
        if not self.active() or not self._answers():
            return
        rt = self.runtime_stub()
        try:
            for p in rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=60).items:
                rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=p.id), timeout=120)
                rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=p.id), timeout=120)
        except Exception as e:  # noqa: BLE001 -- the forced cleanup of CriDaemon handles what is left
            print(f"cleanup through the API failed: {e}", file=sys.stderr)

    def cleanup(self) -> None:
        super().cleanup()
        run("systemctl", "reset-failed", UNIT, check=False)
        # scopes the systemd driver made for this daemon's containers and pods, if any survived
        for line in run("systemctl", "list-units", "--all", "--plain", "--no-legend", "husk-*.scope",
                        check=False).stdout.splitlines():
            if line.split():
                stop_unit(line.split()[0])


@pytest.fixture(scope="session")
def registry_config_dir() -> Iterator[str]:
    """An empty hosts.toml dir: every image is imported, nothing is pulled."""
    d = tempfile.mkdtemp(prefix="husk-node-certs.d-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module", params=DRIVERS)
def node_cri(request: pytest.FixtureRequest, node_images: dict[str, str], node_network: NodeNetwork,
             registry_config_dir: str) -> Iterator[NodeCri]:
    """A running husk-cri.service for one cgroup driver (the fixture's param), its images imported."""
    driver = request.param
    base = f"/var/lib/husk/node-{driver}-{uuid.uuid4().hex[:6]}"
    d = NodeCri(base, node_network, registry_config_dir, driver)
    try:
        import_images(d.root, node_images)
        d.install_unit()
        d.start()
        yield d
    finally:
        d.cleanup()
        shutil.rmtree(base, ignore_errors=True)


# --- kubelet's QoS parents --------------------------------------------------------------------------------------
@dataclass
class QosParent:
    """A pod's cgroup parent made as kubelet makes it: `cgroup_parent` goes into PodSandboxConfig, `path` is the
    cgroup directory relative to /sys/fs/cgroup, `unit` the slice (systemd driver)."""
    driver: str
    pod_uid: str
    cgroup_parent: str
    path: str
    unit: str = ""


def make_qos_parent(driver: str, pod_uid: str) -> QosParent:
    if driver == "cgroupfs":
        # /kubepods/burstable/pod<uid>, controllers enabled all the way down as kubelet's cgroupfs manager does
        path = f"/kubepods/burstable/pod{pod_uid}"
        parts = path.strip("/").split("/")
        enable_controllers("/")
        for i in range(1, len(parts) + 1):
            d = "/" + "/".join(parts[:i])
            os.makedirs(os.path.join(CGROUP, d.lstrip("/")), exist_ok=True)
            if i < len(parts):
                enable_controllers(d)
        return QosParent(driver, pod_uid, path, path)
    # kubepods.slice > kubepods-burstable.slice > kubepods-burstable-pod<uid>.slice, each a transient unit
    escaped = pod_uid.replace("-", "_")          # kubelet escapes the uid's dashes: a dash nests slices
    leaf = f"kubepods-burstable-pod{escaped}.slice"
    for name in ("kubepods.slice", "kubepods-burstable.slice"):
        if unit_property(name, "ActiveState") != "active":
            start_transient_slice(name)
    start_transient_slice(leaf)
    path = f"/kubepods.slice/kubepods-burstable.slice/{leaf}"
    # what kubelet puts in PodSandboxConfig.linux.cgroup_parent under the systemd driver: the slice's path
    return QosParent(driver, pod_uid, path, path, unit=leaf)


def remove_qos_parent(q: QosParent) -> None:
    if q.unit:
        stop_unit(q.unit)
        return
    for d in (q.path, "/kubepods/burstable", "/kubepods"):
        try:
            os.rmdir(os.path.join(CGROUP, d.lstrip("/")))
        except OSError:
            break   # not empty (another pod) or gone


@pytest.fixture
def qos_parent(node_cri: NodeCri) -> Iterator[Any]:
    """make(pod_uid="") -> a QosParent for node_cri's driver; all removed after the test (pods first)."""
    made: list[QosParent] = []

    def make(pod_uid: str = "") -> QosParent:
        q = make_qos_parent(node_cri.driver, pod_uid or str(uuid.uuid4()))
        made.append(q)
        return q

    yield make
    node_cri.remove_all_pods()
    for q in reversed(made):
        remove_qos_parent(q)


# --- pod start latency (reported, never asserted) ----------------------------------------------------------------
LATENCY: dict[str, list[float]] = {}


def record_latency(driver: str, seconds: float) -> None:
    LATENCY.setdefault(driver, []).append(seconds)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not LATENCY:
        return
    summary = {d: {"median_s": round(statistics.median(v), 3), "samples_s": [round(x, 3) for x in v]}
               for d, v in sorted(LATENCY.items())}
    terminalreporter.section("pod start latency (RunPodSandbox + CreateContainer + StartContainer)")
    for d, s in summary.items():
        terminalreporter.write_line(f"husk-node latency {d}: median {s['median_s']:.2f} s over "
                                    f"{len(s['samples_s'])} pods {s['samples_s']}")
