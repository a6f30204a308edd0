"""husk-cri end to end on a systemd cgroup v2 node (scripts/vm-test --node), through its CRI gRPC API as kubelet
drives it, once per cgroup driver (the node_cri fixture's param: cgroupfs, then systemd): pods under kubelet's
QoS parents, init containers and a shared emptyDir, cgroup v2 limits and their update, an OOM kill, stats,
exec and logs, a teardown that leaves nothing behind, and husk-cri stopped and started by systemd under
running pods. Pod start latency is recorded for the report (conftest's terminal summary), never asserted."""
from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.helpers import container_config, exec_sync, run_pod, start_container, status, \
    wait_exited
from tests.node.conftest import BUSYBOX, CGROUP, NodeCri, QosParent, cgroup_of, read_cg, record_latency, run, \
    unit_property, wait_for

pytestmark = [pytest.mark.node, pytest.mark.root, pytest.mark.slow]
MIB = 1024 * 1024
SLOW = 180   # seconds: anything that starts a process under TCG


# --- helpers ------------------------------------------------------------------------------------------------------
def new_pod(cri: NodeCri, q: QosParent, name: str = "") -> tuple[str, pb.PodSandboxConfig]:
    name = name or f"pod-{uuid.uuid4().hex[:6]}"
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace="husk-node", uid=q.pod_uid, attempt=0),
        hostname=name, log_directory=os.path.join(cri.base, "logs", name),
        labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.uid": q.pod_uid})
    cfg.linux.cgroup_parent = q.cgroup_parent
    return run_pod(cri.runtime_stub(), cfg), cfg


def start(cri: NodeCri, pod_id: str, pod: pb.PodSandboxConfig, config: pb.ContainerConfig) -> str:
    return start_container(cri.runtime_stub(), pod_id, pod, config)


def container(name: str, script: str, mounts: list[pb.Mount] | None = None,
              resources: pb.LinuxContainerResources | None = None) -> pb.ContainerConfig:
    c = container_config(name, ["sh", "-c", script], image=BUSYBOX, mounts=mounts or [])
    if resources is not None:
        c.linux.resources.CopyFrom(resources)
    return c


def container_pid(cri: NodeCri, cid: str) -> int:
    resp = cri.runtime_stub().ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True),
                                              timeout=60)
    return int(json.loads(resp.info["info"])["pid"])


def sandbox_pid(cri: NodeCri, pod_id: str) -> int:
    resp = cri.runtime_stub().PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True),
                                               timeout=60)
    return int(json.loads(resp.info["info"])["pid"])


def stop_and_remove(cri: NodeCri, pod_id: str) -> None:
    rt = cri.runtime_stub()
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=SLOW)
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=SLOW)


def check_placement(cri: NodeCri, q: QosParent, object_id: str, pid: int) -> str:
    """The object's cgroup is right below the pod's parent: <parent>/<id> (cgroupfs), or a scope of systemd's in
    the pod's slice (systemd driver). Returns the cgroup path."""
    path = cgroup_of(pid)
    assert os.path.dirname(path) == q.path, f"{object_id[:12]} is in {path}, not below {q.path}"
    if q.driver == "cgroupfs":
        assert path == f"{q.path}/{object_id}"
    else:
        scope = os.path.basename(path)
        assert scope.endswith(".scope") and object_id in scope, path
        assert unit_property(scope, "ActiveState") == "active", scope
        assert unit_property(scope, "ControlGroup") == path
        assert unit_property(scope, "Slice") == q.unit
    return path


def usage_usec(path: str) -> int:
    for line in read_cg(path, "cpu.stat").splitlines():
        k, v = line.split()
        if k == "usage_usec":
            return int(v)
    raise AssertionError(f"{path}/cpu.stat has no usage_usec")


def mounts_naming(*ids: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.strip() for line in f if any(i in line for i in ids)]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


# --- tests --------------------------------------------------------------------------------------------------------
def test_init_container_then_two_containers_sharing_an_emptydir(node_cri: NodeCri, qos_parent: Any,
                                                                 tmp_path: Path) -> None:
    q = qos_parent()
    pod_id, pod = new_pod(node_cri, q)
    rt = node_cri.runtime_stub()
    empty = tmp_path / "empty-dir"        # kubelet's emptyDir: a host directory bound into each container
    empty.mkdir()
    vol = [pb.Mount(container_path="/data", host_path=str(empty))]
    init = start(node_cri, pod_id, pod, container("init", "echo from-init > /data/init", vol))
    st = wait_exited(rt, init, SLOW)
    assert st.exit_code == 0 and st.reason == "Completed", (st.exit_code, st.reason, st.message)
    writer = start(node_cri, pod_id, pod, container("writer", "echo from-writer > /data/w; exec sleep 3600", vol))
    reader = start(node_cri, pod_id, pod, container("reader", "exec sleep 3600", vol))
    wait_for(lambda: (empty / "w").exists(), SLOW, "the writer's file")
    r = exec_sync(rt, reader, ["cat", "/data/init", "/data/w"], timeout=120)
    assert (r.exit_code, r.stdout, r.stderr) == (0, b"from-init\nfrom-writer\n", b"")
    check_placement(node_cri, q, pod_id, sandbox_pid(node_cri, pod_id))
    for cid in (writer, reader):
        assert status(rt, cid).state == pb.CONTAINER_RUNNING
        check_placement(node_cri, q, cid, container_pid(node_cri, cid))
    # the pod is on the guest's bridge network
    ip = rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id), timeout=60).status.network.ip
    assert ip.startswith("10.88."), ip


def test_limits_land_in_the_v2_files_and_update_changes_them(node_cri: NodeCri, qos_parent: Any) -> None:
    q = qos_parent()
    pod_id, pod = new_pod(node_cri, q)
    rt = node_cri.runtime_stub()
    # kubelet sends a hugepage limit for every page size the node has (the guest boots with 2 MB pages): on
    # cgroup v2 the hugetlb controller exists, so it lands in hugetlb.<size>.max under either driver
    res = pb.LinuxContainerResources(cpu_period=100000, cpu_quota=50000, cpu_shares=512,
                                     memory_limit_in_bytes=64 * MIB, unified={"pids.max": "42"},
                                     hugepage_limits=[pb.HugepageLimit(page_size="2MB", limit=4 * MIB)])
    cid = start(node_cri, pod_id, pod, container("limited", "exec sleep 3600", resources=res))
    path = check_placement(node_cri, q, cid, container_pid(node_cri, cid))
    assert read_cg(path, "cpu.max") == "50000 100000"
    assert read_cg(path, "memory.max") == str(64 * MIB)
    assert read_cg(path, "pids.max") == "42"
    assert read_cg(path, "hugetlb.2MB.max") == str(4 * MIB)
    assert read_cg(path, "cpu.weight") != "100"     # shares 512 is not the default weight
    rt.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
        container_id=cid, linux=pb.LinuxContainerResources(cpu_period=100000, cpu_quota=25000,
                                                           memory_limit_in_bytes=96 * MIB)), timeout=SLOW)
    assert read_cg(path, "memory.max") == str(96 * MIB)
    assert read_cg(path, "cpu.max") == "25000 100000"
    if q.driver == "systemd":
        # systemd re-applies a unit's own settings to its cgroup on daemon-reload: the driver must have told
        # systemd the new limits (as runc does with SetUnitProperties), not only written the files
        run("systemctl", "daemon-reload")
        assert read_cg(path, "memory.max") == str(96 * MIB)
        assert read_cg(path, "cpu.max") == "25000 100000"
        assert read_cg(path, "pids.max") == "42"


def test_a_memory_hog_is_oom_killed_and_reported(node_cri: NodeCri, qos_parent: Any) -> None:
    q = qos_parent()
    pod_id, pod = new_pod(node_cri, q)
    # busybox tail keeps the whole "line" of /dev/zero (no newline ever comes) in memory
    res = pb.LinuxContainerResources(memory_limit_in_bytes=32 * MIB)
    cid = start(node_cri, pod_id, pod, container("hog", "exec tail /dev/zero", resources=res))
    st = wait_exited(node_cri.runtime_stub(), cid, SLOW)
    assert (st.reason, st.exit_code) == ("OOMKilled", 137), (st.reason, st.exit_code, st.message)


def test_container_and_pod_stats_come_from_the_v2_files(node_cri: NodeCri, qos_parent: Any) -> None:
    q = qos_parent()
    pod_id, pod = new_pod(node_cri, q)
    rt = node_cri.runtime_stub()
    cid = start(node_cri, pod_id, pod, container(
        "busy", "i=0; while [ $i -lt 3000 ]; do i=$((i+1)); done; touch /tmp/done; exec sleep 3600",
        resources=pb.LinuxContainerResources(memory_limit_in_bytes=64 * MIB)))
    path = check_placement(node_cri, q, cid, container_pid(node_cri, cid))
    wait_for(lambda: exec_sync(rt, cid, ["test", "-e", "/tmp/done"], timeout=60).exit_code == 0, SLOW,
             "the busy loop to end")
    before = usage_usec(path) * 1000
    s = rt.ContainerStats(pb.ContainerStatsRequest(container_id=cid), timeout=SLOW).stats
    after = usage_usec(path) * 1000
    assert s.attributes.id == cid
    assert before <= s.cpu.usage_core_nano_seconds.value <= after, (before, s.cpu, after)
    assert 0 < s.memory.working_set_bytes.value <= s.memory.usage_bytes.value <= 64 * MIB
    assert s.memory.available_bytes.value == 64 * MIB - s.memory.working_set_bytes.value
    stats = rt.ListPodSandboxStats(pb.ListPodSandboxStatsRequest(
        filter=pb.PodSandboxStatsFilter(id=pod_id)), timeout=SLOW).stats
    assert [p.attributes.id for p in stats] == [pod_id]
    linux = stats[0].linux
    assert [c.attributes.id for c in linux.containers] == [cid]
    # the pod: the pause container plus its container, each read from its own cgroup
    assert linux.cpu.usage_core_nano_seconds.value >= linux.containers[0].cpu.usage_core_nano_seconds.value > 0
    assert linux.memory.working_set_bytes.value >= linux.containers[0].memory.working_set_bytes.value
    assert linux.process.process_count.value >= 2
    assert "eth0" in [i.name for i in linux.network.interfaces] or linux.network.default_interface.name == "eth0"


def test_exec_sync_and_the_cri_log_file(node_cri: NodeCri, qos_parent: Any) -> None:
    q = qos_parent()
    pod_id, pod = new_pod(node_cri, q)
    rt = node_cri.runtime_stub()
    cid = start(node_cri, pod_id, pod, container("talker", "echo hello-out; echo hello-err >&2; exec sleep 3600"))
    r = exec_sync(rt, cid, ["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=120)
    assert (r.exit_code, r.stdout, r.stderr) == (3, b"out\n", b"err\n")
    log_path = os.path.join(pod.log_directory, "talker.log")

    def lines() -> list[list[str]]:
        try:
            with open(log_path) as f:
                return [line.rstrip("\n").split(" ", 3) for line in f]
        except FileNotFoundError:
            return []
    got = wait_for(lambda: len(lines()) >= 2 and lines(), SLOW, f"two lines in {log_path}")
    assert sorted((stream, tag, text) for _, stream, tag, text in got) == [
        ("stderr", "F", "hello-err"), ("stdout", "F", "hello-out")]


def test_stop_and_remove_leave_no_scope_cgroup_mount_or_process(node_cri: NodeCri, qos_parent: Any) -> None:
    q = qos_parent()
    pod_id, pod = new_pod(node_cri, q)
    ids = [pod_id]
    paths, pids = [], [sandbox_pid(node_cri, pod_id)]
    paths.append(check_placement(node_cri, q, pod_id, pids[0]))
    for name in ("one", "two"):
        cid = start(node_cri, pod_id, pod, container(name, "exec sleep 3600"))
        ids.append(cid)
        pids.append(container_pid(node_cri, cid))
        paths.append(check_placement(node_cri, q, cid, pids[-1]))
    assert node_cri.shim_pids()
    stop_and_remove(node_cri, pod_id)
    left = {
        "processes": [p for p in pids if alive(p)],
        "cgroups": [p for p in paths if os.path.exists(os.path.join(CGROUP, p.lstrip("/")))],
        "children of the pod's parent": [d for d in os.listdir(os.path.join(CGROUP, q.path.lstrip("/")))
                                         if os.path.isdir(os.path.join(CGROUP, q.path.lstrip("/"), d))],
        "mounts": mounts_naming(*ids),
        "shims": node_cri.shim_pids(),
        "netns": os.listdir(os.path.join(node_cri.state, "netns"))
        if os.path.isdir(os.path.join(node_cri.state, "netns")) else [],
    }
    if q.driver == "systemd":
        left["scopes"] = [os.path.basename(p) for p in paths
                          if unit_property(os.path.basename(p), "LoadState") not in ("not-found", "")
                          and unit_property(os.path.basename(p), "ActiveState") not in ("inactive", "")]
    assert not {k: v for k, v in left.items() if v}, left
    assert not node_cri.runtime_stub().ListPodSandbox(
        pb.ListPodSandboxRequest(filter=pb.PodSandboxFilter(id=pod_id)), timeout=60).items


def test_husk_cri_stopped_and_started_by_systemd_keeps_and_recovers_pods(node_cri: NodeCri, qos_parent: Any,
                                                                        tmp_path: Path) -> None:
    q = qos_parent()
    pod_id, pod = new_pod(node_cri, q)
    empty = tmp_path / "signal"
    empty.mkdir()
    vol = [pb.Mount(container_path="/data", host_path=str(empty))]
    stays = start(node_cri, pod_id, pod, container("stays", "exec sleep 3600", vol))
    leaves = start(node_cri, pod_id, pod, container(
        "leaves", "while [ ! -e /data/exit ]; do sleep 0.2; done; exit 7", vol))
    stays_pid, leaves_pid = container_pid(node_cri, stays), container_pid(node_cri, leaves)
    pause_pid = sandbox_pid(node_cri, pod_id)
    old_main = node_cri.main_pid()

    node_cri.stop()
    assert not node_cri.active() and not alive(old_main)
    assert alive(stays_pid) and alive(pause_pid), "stopping husk-cri.service took the pod down (KillMode=process)"
    (empty / "exit").touch()                                  # one container exits while husk-cri is down
    wait_for(lambda: not alive(leaves_pid), SLOW, "the leaving container to exit")

    node_cri.start()
    rt = node_cri.runtime_stub()
    pods = rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=60).items
    assert [(p.id, p.state) for p in pods if p.id == pod_id] == [(pod_id, pb.SANDBOX_READY)]
    st = wait_exited(rt, leaves, SLOW)
    assert st.exit_code == 7, (st.exit_code, st.reason, st.message)
    assert status(rt, stays).state == pb.CONTAINER_RUNNING
    assert container_pid(node_cri, stays) == stays_pid
    check_placement(node_cri, q, stays, stays_pid)
    r = exec_sync(rt, stays, ["echo", "still-here"], timeout=120)
    assert (r.exit_code, r.stdout) == (0, b"still-here\n")


def test_pod_start_latency_is_recorded(node_cri: NodeCri, qos_parent: Any) -> None:
    """RunPodSandbox + CreateContainer + StartContainer, a few pods one after another: reported, not judged."""
    for _ in range(3):
        q = qos_parent()
        t0 = time.monotonic()
        pod_id, pod = new_pod(node_cri, q)
        cid = start(node_cri, pod_id, pod, container("app", "exec sleep 3600"))
        record_latency(node_cri.driver, time.monotonic() - t0)
        assert status(node_cri.runtime_stub(), cid).state == pb.CONTAINER_RUNNING
        stop_and_remove(node_cri, pod_id)
