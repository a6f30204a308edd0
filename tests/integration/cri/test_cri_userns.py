"""Pods in their own user namespace (userns_options mode POD, Kubernetes `hostUsers: false`) through husk-cri:
the pause container makes it with kubelet's mappings, the containers join it, the rootfs and the volumes are
idmapped; what container root may do on the host is what an unprivileged id may. Mode NODE is the node's."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import grpc
import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX
from tests.integration.cri.helpers import container_config, exec_sync, nothing_left, pod_config, run_pod, \
    start_container

pytestmark = [pytest.mark.root, pytest.mark.e2e]

HOST_ID = 200000
SIZE = 65536
FOREIGN_UID = 70000  # a host id outside the pod's range: not mapped through the idmapped volume


def _userns_pod(cri, name: str, mode: int = pb.POD) -> pb.PodSandboxConfig:
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    pod = pod_config(cri, name)
    u = pod.linux.security_context.namespace_options.userns_options
    u.mode = mode
    if mode == pb.POD:
        u.uids.append(pb.IDMapping(container_id=0, host_id=HOST_ID, length=SIZE))
        u.gids.append(pb.IDMapping(container_id=0, host_id=HOST_ID, length=SIZE))
    return pod


def _container(pod: pb.PodSandboxConfig, name: str, cmd: list[str], **kw) -> pb.ContainerConfig:
    c = container_config(name, cmd, **kw)
    c.linux.security_context.namespace_options.userns_options.CopyFrom(
        pod.linux.security_context.namespace_options.userns_options)
    return c


@pytest.fixture
def host_dirs():
    d = Path(tempfile.mkdtemp(prefix="hct-userns-"))
    os.chmod(d, 0o755)
    (d / "vol").mkdir()
    (d / "vol" / "hosts-file").write_text("host root's\n")
    (d / "foreign").mkdir()
    os.chown(d / "foreign", FOREIGN_UID, FOREIGN_UID)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_pod_user_namespace_idmaps_rootfs_and_volumes(cri, host_dirs: Path) -> None:
    rt = cri.runtime_stub()
    pod = _userns_pod(cri, "userns")
    pod_id = run_pod(rt, pod)
    c = _container(pod, "main", ["sleep", "1000"],
                   mounts=[pb.Mount(container_path="/vol", host_path=str(host_dirs / "vol")),
                           pb.Mount(container_path="/foreign", host_path=str(host_dirs / "foreign"))])
    cid = start_container(rt, pod_id, pod, c)

    def sh(script: str) -> str:
        r = exec_sync(rt, cid, ["sh", "-c", script])
        return r.stdout.decode() + r.stderr.decode()

    assert sh("cat /proc/self/uid_map").split() == ["0", str(HOST_ID), str(SIZE)]
    assert sh("cat /proc/self/gid_map").split() == ["0", str(HOST_ID), str(SIZE)]
    assert sh("id -u; stat -c %u:%g /bin/sh /vol/hosts-file").split() == ["0", "0:0", "0:0"]
    # the pod's containers share the pause container's user namespace
    info = json.loads(rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True)).info["info"])
    pid = info["pid"]
    pause = json.loads(rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True))
                       .info["info"])["pid"]
    assert os.readlink(f"/proc/{pid}/ns/user") == os.readlink(f"/proc/{pause}/ns/user") \
        != os.readlink("/proc/self/ns/user")
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    assert status["Uid"].split() == [str(HOST_ID)] * 4  # container root is an unprivileged id on the host

    # a file container root makes in the volume: root's inside, the mapped id as the container's processes see
    # it from the host's view of their mounts, and stored with the id it has in the mount (0)
    assert sh("touch /vol/made && echo made").strip() == "made"
    assert os.stat(f"/proc/{pid}/root/vol/made").st_uid == HOST_ID
    assert (host_dirs / "vol" / "made").stat().st_uid == 0
    # a host directory whose owner is not in the pod's range: container root has no power over it
    out = sh("touch /foreign/x 2>&1; mount -t tmpfs none /tmp 2>&1; echo end")
    # busybox's words for EPERM from mount(2): no CAP_SYS_ADMIN (the default capabilities)
    assert "Permission denied" in out and "permission denied (are you root?)" in out and out.strip().endswith("end")
    assert not (host_dirs / "foreign" / "x").exists()

    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    nothing_left(cri)


def test_cap_sys_admin_inside_is_no_power_over_the_host(cri) -> None:
    rt = cri.runtime_stub()
    pod = _userns_pod(cri, "usernsadmin")
    pod_id = run_pod(rt, pod)
    c = _container(pod, "admin", ["sleep", "1000"])
    c.linux.security_context.capabilities.add_capabilities.append("SYS_ADMIN")
    cid = start_container(rt, pod_id, pod, c)
    r = exec_sync(rt, cid, ["sh", "-c", "grep CapEff /proc/self/status; mount -t sysfs sysfs /tmp 2>&1; "
                                        "mknod /tmp/sda b 8 0 2>&1; echo end"])
    out = r.stdout.decode() + r.stderr.decode()
    cap_eff = int(out.split()[1], 16)
    assert cap_eff & (1 << 21) and cap_eff & (1 << 27)  # CAP_SYS_ADMIN, CAP_MKNOD: in the pod's namespace only
    # sysfs belongs to the network namespace, which the host's user namespace owns; device nodes are the host's
    assert "permission denied (are you root?)" in out, out
    assert "mknod: /tmp/sda: Operation not permitted" in out, out
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))


def test_node_mode_keeps_the_node_user_namespace(cri) -> None:
    rt = cri.runtime_stub()
    pod = _userns_pod(cri, "usernsnode", pb.NODE)
    pod_id = run_pod(rt, pod)
    cid = start_container(rt, pod_id, pod, _container(pod, "n", ["sleep", "1000"]))
    r = exec_sync(rt, cid, ["cat", "/proc/self/uid_map"])
    assert r.stdout.decode().split() == Path("/proc/self/uid_map").read_text().split()
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))


def test_unsafe_mappings_are_invalid_argument(cri) -> None:
    rt = cri.runtime_stub()
    pod = _userns_pod(cri, "usernsbad")
    pod.linux.security_context.namespace_options.userns_options.uids[0].host_id = 0  # the host's root
    with pytest.raises(grpc.RpcError) as info:
        run_pod(rt, pod)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "uids[0].host_id" in info.value.details() and "host's root" in info.value.details()
    nothing_left(cri)


def test_status_reports_user_namespace_support(cri) -> None:
    st = cri.runtime_stub().Status(pb.StatusRequest())
    assert [h.features.user_namespaces for h in st.runtime_handlers if h.name == ""] == [True]
