"""What spec options read: the CRI request, the image config, the sandbox the container joins, the host.

Plain records, filled by the RPC handlers or by tests; nothing here does I/O except
HostInfo.detect() and the hugetlb_controller() it calls.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from cri_server.api.v1 import api_pb2 as pb
from cri_server.errors import InvalidArgument
from cri_server.oom import OomScorePolicy

Spec = dict[str, Any]


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config (its "config" object) a container spec uses."""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    working_dir: str = ""
    user: str = ""
    stop_signal: str = ""

    @staticmethod
    def from_oci(config: Mapping[str, Any] | None) -> "ImageConfig":
        c = config or {}
        return ImageConfig(entrypoint=tuple(c.get("Entrypoint") or ()), cmd=tuple(c.get("Cmd") or ()),
                           env=tuple(c.get("Env") or ()), working_dir=c.get("WorkingDir") or "",
                           user=c.get("User") or "", stop_signal=c.get("StopSignal") or "")


def _read_mountinfo() -> str:
    with open("/proc/self/mountinfo") as f:
        return f.read()


@dataclass(frozen=True)
class HostInfo:
    capabilities: tuple[str, ...]          # the bounding set: what privileged / ALL may grant
    oom: OomScorePolicy
    swap_controller: bool = False          # cgroup v1 memory.memsw.* present
    hugepage_sizes: tuple[str, ...] = ()   # "2MB", "1GB"
    nofile_limit: int = 1048576            # RLIMIT_NOFILE of containers (capped where hard limits cannot rise)
    mountinfo: Callable[[], str] = lambda: _read_mountinfo()  # text: spec/mounts.py parses it (runtime.mountinfo)
    systemd_cgroup: bool = False           # the systemd cgroup driver: slice parents, slice:husk:<id> paths
    hugetlb_controller: bool = True        # the containers' cgroup hierarchy has the hugetlb controller
    tolerate_missing_hugetlb: bool = False  # without it, drop limits of 0 (config: tolerate_missing_...)

    @staticmethod
    def detect(oom: OomScorePolicy, systemd_cgroup: bool = False,
               tolerate_missing_hugetlb: bool = True) -> "HostInfo":
        from cri_server.spec.caps import host_capabilities
        sizes = []
        try:
            for d in os.listdir("/sys/kernel/mm/hugepages"):
                kb = int(d.removeprefix("hugepages-").removesuffix("kB"))
                sizes.append(f"{kb // 1024 // 1024}GB" if kb >= 1 << 20 else f"{kb // 1024}MB")
        except (OSError, ValueError):
            pass
        swap = (os.path.exists("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
                or os.path.exists("/sys/fs/cgroup/memory.swap.max"))
        hugetlb = hugetlb_controller()
        if not hugetlb:
            import logging
            logging.getLogger(__name__).info(
                "no hugetlb cgroup controller for containers: %s", "hugepage limits of 0 are dropped, others "
                "refused" if tolerate_missing_hugetlb else "hugepage limits go to the runtime, which refuses them")
        return HostInfo(host_capabilities(), oom, swap, tuple(sizes), nofile_limit(oom),
                        systemd_cgroup=systemd_cgroup, hugetlb_controller=hugetlb,
                        tolerate_missing_hugetlb=tolerate_missing_hugetlb)


def hugetlb_controller() -> bool:
    """Whether containers can get hugetlb limits, decided as containerd does: on a cgroup v2 host the root's
    cgroup.controllers lists hugetlb; on v1 and hybrid hosts a v1 hugetlb hierarchy is mounted (the runtime
    writes v1 limits only there, even when the hybrid host's cgroup2 mount has the controller)."""
    from runtime.cgroups import CGROUP_ROOT, is_unified
    if is_unified():
        try:
            with open(os.path.join(CGROUP_ROOT, "cgroup.controllers")) as f:
                return "hugetlb" in f.read().split()
        except OSError:
            return False
    from runtime.cgroups.v1 import hierarchies
    try:
        return "hugetlb" in hierarchies()
    except OSError:
        return False


def nofile_limit(oom: OomScorePolicy, wanted: int = 1048576) -> int:
    """containerd's 1048576 open files, unless this host cannot raise a hard limit (no CAP_SYS_RESOURCE, the
    same condition that restricts oom_score_adj): then husk-cri's own hard limit, which runtimes may keep."""
    import resource
    if oom.minimum <= -1000:
        return wanted
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


@dataclass(frozen=True)
class SandboxInfo:
    """The running sandbox a container joins, and the files RunPodSandbox made for it."""
    id: str
    pid: int                              # the pause process; its namespaces are joined by path
    netns_path: str = ""                  # the pinned network namespace ("" for host network)
    hostname: str = ""
    hosts_path: str = ""
    resolv_path: str = ""
    hostname_path: str = ""
    shm_path: str = ""                    # the pod's /dev/shm ("" for host IPC)
    cgroup_parent: str = ""


@dataclass(frozen=True)
class SandboxContext:
    id: str
    config: pb.PodSandboxConfig
    image: ImageConfig
    rootfs: str
    host: HostInfo
    netns_path: str = ""
    shm_path: str = ""
    image_name: str = ""
    runtime_handler: str = ""


@dataclass(frozen=True)
class ContainerContext:
    id: str
    config: pb.ContainerConfig
    sandbox_config: pb.PodSandboxConfig
    sandbox: SandboxInfo
    image: ImageConfig
    rootfs: str                           # the container's rootfs (for /etc/passwd, /etc/group)
    container_dir: str                    # husk's own per-container dir (termination message file)
    host: HostInfo
    target_pid: int = 0                   # the init of the container a TARGET pid namespace joins
    image_name: str = ""
    make_host_dirs: bool = True           # create missing hostPath directories, as containerd does
    extra: Mapping[str, Any] = field(default_factory=dict)


def ensure(spec: Spec, *keys: str) -> dict[str, Any]:
    """spec[k1][k2]... as a dict, created on the way."""
    d = spec
    for k in keys:
        d = d.setdefault(k, {})
    return d


def invalid(field_path: str, reason: str) -> InvalidArgument:
    return InvalidArgument(f"{field_path}: {reason}")
