"""Request builders and waits shared by husk-cri's integration tests."""
from __future__ import annotations

import os
import subprocess
import uuid
from typing import Any

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX
from tests.support import procfs
from tests.support.cri import CriDaemon
from tests.support.waiting import wait_for  # noqa: F401 -- the suites import it from here


def pod_config(cri: CriDaemon, name: str = "", log_dir: str = "", **kw: Any) -> pb.PodSandboxConfig:
    name = name or f"pod-{uuid.uuid4().hex[:6]}"
    c = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace="hct", uid=f"uid-{name}", attempt=0),
        hostname=name, log_directory=log_dir or os.path.join(cri.base, "logs", name),
        labels={"io.kubernetes.pod.name": name, "test": "hct"}, annotations={"a": "b"}, **kw)
    c.linux.cgroup_parent = cri.cgroup_parent
    return c


def container_config(name: str, cmd: list[str], image: str = BUSYBOX, **kw: Any) -> pb.ContainerConfig:
    """A container as kubelet describes one: its own pid namespace (kubelet's default)."""
    c = pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name), image=pb.ImageSpec(image=image),
                           command=cmd, log_path=f"{name}.log", labels={"c": name}, **kw)
    c.linux.security_context.namespace_options.pid = pb.CONTAINER
    return c


def run_pod(rt: Any, config: pb.PodSandboxConfig) -> str:
    return rt.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=120).pod_sandbox_id


def start_container(rt: Any, pod_id: str, pod: pb.PodSandboxConfig, config: pb.ContainerConfig) -> str:
    cid = rt.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config,
                                                       sandbox_config=pod), timeout=60).container_id
    rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
    return cid


def status(rt: Any, cid: str) -> pb.ContainerStatus:
    return rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid), timeout=30).status




def wait_exited(rt: Any, cid: str, timeout: float = 30.0) -> pb.ContainerStatus:
    return wait_for(lambda: (s := status(rt, cid)).state == pb.CONTAINER_EXITED and s, timeout,
                    f"container {cid[:12]} to exit")


def exec_sync(rt: Any, cid: str, cmd: list[str], timeout: int = 30) -> pb.ExecSyncResponse:
    return rt.ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=cmd, timeout=timeout), timeout=timeout + 30)


def leftovers(cri: CriDaemon) -> dict[str, list[str]]:
    """What exists on the host for objects of this daemon: dirs, runc containers, netns pins, mounts."""
    from cri_server import fsutil
    out: dict[str, list[str]] = {}
    for sub in ("bundles", "shims", "netns", "sandboxes"):
        d = os.path.join(cri.state, sub)
        out[sub] = sorted(os.listdir(d)) if os.path.isdir(d) else []
    for sub in ("sandboxes", "containers"):
        d = os.path.join(cri.root, sub)
        out["root-" + sub] = sorted(os.listdir(d)) if os.path.isdir(d) else []
    active = os.path.join(cri.root, "images", "snapshots", "active")
    out["snapshots"] = sorted(os.listdir(active)) if os.path.isdir(active) else []
    out["runtime"] = cri.runtime_ids()
    out["mounts"] = [m for m in fsutil.mounts_under(cri.state) + fsutil.mounts_under(cri.root)]
    out["shim_pids"] = [str(p) for p in cri.shim_pids()]
    return out


def nothing_left(cri: CriDaemon) -> None:
    left = {k: v for k, v in leftovers(cri).items() if v}
    assert not left, f"left behind: {left}"


def _unix_sockets() -> dict[int, tuple[int, int]]:
    """inode -> (bytes in its receive queue, the peer's inode) of every connected unix stream socket."""
    out = subprocess.run(["ss", "-x", "-n"], capture_output=True, text=True, check=True).stdout
    table = {}
    for line in out.splitlines()[1:]:
        f = line.split()
        if len(f) >= 8 and f[0] == "u_str" and f[5].isdigit() and f[7].isdigit():
            table[int(f[5])] = (int(f[2]), int(f[7]))
    return table


def shim_queues(shim_pid: int) -> tuple[int, int]:
    """Bytes waiting to be read (by the shim, by husk-cri) on the connections to the shim's sockets: with the
    shim or husk-cri SIGSTOPped, shows a request or an answer in flight (fault tests force an order with it)."""
    inodes = {int(t[len("socket:["):-1]) for t in procfs.fd_targets(shim_pid) if t.startswith("socket:[")}
    table = _unix_sockets()
    to_shim = to_cri = 0
    for ino in inodes & table.keys():
        recv, peer = table[ino]
        to_shim += recv
        to_cri += table.get(peer, (0, 0))[0]
    return to_shim, to_cri
