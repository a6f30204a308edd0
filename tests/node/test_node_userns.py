"""A pod in its own user namespace (userns_options mode POD, Kubernetes `hostUsers: false`) on the systemd cgroup
v2 node (scripts/vm-test --node), with the systemd driver: the mapping inside, an idmapped emptyDir, the pod's
cgroups where kubelet expects them, and the cgroup v2 tree mounted from the pod's cgroup namespace.

The guest's kernel (Debian 12's 6.1) cannot idmap its own filesystems (9p, tmpfs before 6.3, overlayfs), so
husk-cri's root (snapshots, pod files) and the emptyDir live on an ext4 loop device here, as on a real node's
disk; husk-cri's Status says user namespaces are not supported for a root it cannot idmap (checked too)."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.node.conftest import NodeCri, NodeNetwork, import_images, run, wait_for
from tests.node.test_node_e2e import SLOW, check_placement, container, container_pid, sandbox_pid, start, \
    stop_and_remove
from tests.integration.cri.helpers import exec_sync, run_pod

pytestmark = [pytest.mark.node, pytest.mark.root, pytest.mark.slow]

HOST_ID = 300000
SIZE = 65536


@pytest.fixture(scope="module")
def ext4() -> Iterator[str]:
    """An ext4 filesystem on a loop device (a sparse image in the guest's memory), mounted."""
    work = tempfile.mkdtemp(prefix="husk-node-ext4-")
    img, mnt = os.path.join(work, "fs.img"), os.path.join(work, "mnt")
    os.mkdir(mnt)
    run("truncate", "-s", "512M", img)
    run("mkfs.ext4", "-q", "-F", img, timeout=300)
    run("mount", "-o", "loop", img, mnt)
    os.chmod(mnt, 0o755)
    try:
        yield mnt
    finally:
        run("umount", mnt, check=False)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def node_cri(node_images: dict[str, str], node_network: NodeNetwork, registry_config_dir: str,
             ext4: str) -> Iterator[NodeCri]:
    """This module's husk-cri.service (systemd driver) with its root on the ext4 filesystem."""
    d = NodeCri(os.path.join(ext4, f"node-userns-{uuid.uuid4().hex[:6]}"), node_network, registry_config_dir,
                "systemd")
    try:
        import_images(d.root, node_images)
        d.install_unit()
        d.start()
        yield d
    finally:
        d.cleanup()
        shutil.rmtree(d.base, ignore_errors=True)


def test_status_says_user_namespaces_are_supported(node_cri: NodeCri) -> None:
    st = node_cri.runtime_stub().Status(pb.StatusRequest(), timeout=60)
    assert [h.features.user_namespaces for h in st.runtime_handlers if h.name == ""] == [True]
    # and the probe behind it refuses the guest's own root filesystem (overlayfs over 9p)
    cp = run(sys.executable, "-m", "runtime.idmap", "/var/lib", check=False)
    assert cp.returncode == 1 and "cannot idmap" in cp.stdout, cp.stdout


def test_user_namespaced_pod_on_cgroup_v2(node_cri: NodeCri, qos_parent: Any, ext4: str) -> None:
    q = qos_parent()
    name = "userns-pod"
    pod = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace="husk-node", uid=q.pod_uid, attempt=0),
        hostname=name, log_directory=os.path.join(node_cri.base, "logs", name),
        labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.uid": q.pod_uid})
    pod.linux.cgroup_parent = q.cgroup_parent
    u = pod.linux.security_context.namespace_options.userns_options
    u.mode = pb.POD
    u.uids.append(pb.IDMapping(container_id=0, host_id=HOST_ID, length=SIZE))
    u.gids.append(pb.IDMapping(container_id=0, host_id=HOST_ID, length=SIZE))
    pod_id = run_pod(node_cri.runtime_stub(), pod)
    rt = node_cri.runtime_stub()
    empty = Path(node_cri.base) / "empty-dir"   # kubelet's emptyDir, on the node's disk
    empty.mkdir()
    c = container("main", "touch /data/made; exec sleep 3600",
                  [pb.Mount(container_path="/data", host_path=str(empty))])
    c.linux.security_context.namespace_options.userns_options.CopyFrom(u)
    cid = start(node_cri, pod_id, pod, c)
    wait_for(lambda: (empty / "made").exists(), SLOW, "the container's file")
    r = exec_sync(rt, cid, ["sh", "-c", "cat /proc/self/uid_map; id -u; stat -c %u /bin/sh; "
                                        "cat /sys/fs/cgroup/cgroup.controllers >/dev/null && echo cgroup2"],
                  timeout=120)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.decode().split() == ["0", str(HOST_ID), str(SIZE), "0", "0", "cgroup2"]
    assert (empty / "made").stat().st_uid == 0  # stored as the id it has in the idmapped volume
    pid = container_pid(node_cri, cid)
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    assert status["Uid"].split() == [str(HOST_ID)] * 4
    check_placement(node_cri, q, pod_id, sandbox_pid(node_cri, pod_id))
    check_placement(node_cri, q, cid, pid)
    stop_and_remove(node_cri, pod_id)
