"""Spec options for cgroups and kernel parameters: cpu, memory, hugepages, unified, cgroupsPath, sysctls."""
from __future__ import annotations

import re

from cri_server.api.v1 import api_pb2 as pb
from cri_server.spec.context import ContainerContext, HostInfo, SandboxContext, Spec, ensure, invalid

# containerd's CPU shares for the pause container: it needs almost nothing.
SANDBOX_CPU_SHARES = 2
_CPUSET = re.compile(r"^(\d+(-\d+)?)(,\d+(-\d+)?)*$")
_PAGE_SIZE = re.compile(r"^\d+(KB|MB|GB|TB|PB)$")


def linux_resources(r: pb.LinuxContainerResources, field: str, swap_controller: bool,
                    drop_zero_hugepage_limits: bool = False) -> dict:
    """The OCI linux.resources object for CRI resources; zero means unset, negative is an error.
    `drop_zero_hugepage_limits`: the node has no hugetlb controller and tolerates that (`hugepage_policy`)."""
    out: dict = {}
    for name in ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes"):
        if getattr(r, name) < 0 and not (name == "cpu_quota" and r.cpu_quota == -1):
            raise invalid(f"{field}.{name}", "must not be negative")
    cpu: dict = {}
    if r.cpu_shares:
        cpu["shares"] = r.cpu_shares
    if r.cpu_quota:
        cpu["quota"] = r.cpu_quota
    if r.cpu_period:
        cpu["period"] = r.cpu_period
    for name, key in (("cpuset_cpus", "cpus"), ("cpuset_mems", "mems")):
        v = getattr(r, name)
        if v:
            if not _CPUSET.match(v):
                raise invalid(f"{field}.{name}", f"{v!r} is not a cpu list like 0-3,6")
            cpu[key] = v
    if cpu:
        out["cpu"] = cpu
    mem: dict = {}
    if r.memory_limit_in_bytes:
        mem["limit"] = r.memory_limit_in_bytes
        if r.memory_swap_limit_in_bytes:
            if 0 < r.memory_swap_limit_in_bytes < r.memory_limit_in_bytes:
                raise invalid(f"{field}.memory_swap_limit_in_bytes", "must not be below memory_limit_in_bytes")
            mem["swap"] = r.memory_swap_limit_in_bytes
        elif swap_controller:
            # Equal limits: no swapping unless asked for (containerd does the same).
            mem["swap"] = r.memory_limit_in_bytes
    if mem:
        out["memory"] = mem
    pages = []
    for i, h in enumerate(r.hugepage_limits):
        if not _PAGE_SIZE.match(h.page_size):
            raise invalid(f"{field}.hugepage_limits[{i}].page_size", f"{h.page_size!r} is not like 2MB")
        if drop_zero_hugepage_limits:
            if h.limit:
                raise invalid(f"{field}.hugepage_limits[{i}].limit",
                              f"{h.limit} bytes of {h.page_size} pages cannot be enforced: this node has no "
                              "hugetlb cgroup controller (limits of 0 are dropped; a non-zero limit is refused)")
            continue
        pages.append({"pageSize": h.page_size, "limit": h.limit})
    if pages:
        out["hugepageLimits"] = pages
    if r.unified:
        for k in r.unified:
            if "/" in k or k.startswith("."):
                raise invalid(f"{field}.unified", f"{k!r} is not a cgroup file name")
        out["unified"] = dict(r.unified)
    return out


def hugepage_policy(host: HostInfo) -> bool:
    """True when limits of 0 are to be dropped: no hugetlb controller, and the config tolerates that (kubelet
    sends a limit of 0 for every page size the node has, so a node without the controller could run nothing).
    Otherwise every limit goes to the runtime, which applies it or refuses it."""
    return not host.hugetlb_controller and host.tolerate_missing_hugetlb


def with_resources(spec: Spec, ctx: ContainerContext) -> None:
    res = linux_resources(ctx.config.linux.resources, "config.linux.resources", ctx.host.swap_controller,
                          hugepage_policy(ctx.host))
    target = ensure(spec, "linux", "resources")
    target.update(res)


# systemd driver: cgroupsPath "<slice>:husk:<id>", which the runtime makes the scope husk-<id>.scope in that slice
# (containerd's prefix is cri-containerd). Without a parent: system.slice, where runc's systemd driver puts a
# container whose cgroupsPath is empty (containerd itself sends /k8s.io/<id> there, which runc refuses).
SCOPE_PREFIX = "husk"
DEFAULT_SLICE = "system.slice"
DEFAULT_CGROUPFS_PARENT = "/husk"
# systemd's unit name characters, less ':' (the cgroupsPath separator) and '@' (slices are not templates)
_SLICE = re.compile(r"^[A-Za-z0-9_.\\-]+\.slice$")


def cgroups_path(parent: str, object_id: str, systemd: bool = False) -> str:
    """The OCI cgroupsPath of a sandbox or container from its pod's (checked) cgroup parent.
    cgroupfs: <cgroup_parent>/<id>, absolute (kubelet sends /kubepods/... parents); systemd: <slice>:husk:<id>."""
    if systemd:
        return f"{parent or DEFAULT_SLICE}:{SCOPE_PREFIX}:{object_id}"
    parent = parent or DEFAULT_CGROUPFS_PARENT
    if not parent.startswith("/"):
        parent = "/" + parent
    return parent.rstrip("/") + "/" + object_id


def check_parent(parent: str, systemd: bool, field: str = "config.linux.cgroup_parent") -> str:
    """The pod's cgroup parent as the driver takes it, or InvalidArgument. systemd: the slice, given as its path
    (what kubelet sends: /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice; the last one
    is used, as containerd does, and the path must be where systemd puts it) or as its name alone; cgroupfs: a
    path without '..'."""
    if systemd:
        return _check_slice(parent, field)
    if parent.endswith(".slice"):
        raise invalid(field, f"{parent!r} is a systemd slice, but husk-cri uses the cgroupfs driver (paths like "
                             "/kubepods/x); set runtime.systemd_cgroup = true for kubelet's systemd cgroup driver")
    if ".." in parent.split("/"):
        raise invalid(field, f"{parent!r} must not contain '..'")
    return parent


def _check_slice(parent: str, field: str) -> str:
    if not parent:
        return ""
    parts = [p for p in parent.split("/") if p]
    if not parts or not all(p.endswith(".slice") for p in parts):
        raise invalid(field, f"{parent!r} is not a systemd slice, but husk-cri uses the systemd cgroup driver "
                             "(runtime.systemd_cgroup = true): a parent is a slice like kubepods-burstable-pod<uid>"
                             ".slice; set systemd_cgroup = false for kubelet's cgroupfs driver")
    leaf = parts[-1]
    if not _SLICE.match(leaf) or len(leaf) > 255:
        raise invalid(field, f"{leaf!r} is not a valid slice name (letters, digits, '_', '.', '-' and '\\', "
                             "ending in .slice)")
    expanded = expand_slice(leaf, field)
    if len(parts) > 1 and "/" + "/".join(parts) != expanded:
        raise invalid(field, f"{parent!r} is not where systemd puts {leaf} ({expanded})")
    return leaf


def expand_slice(name: str, field: str = "config.linux.cgroup_parent") -> str:
    """The cgroup directory of a slice relative to the root: a-b-c.slice -> /a.slice/a-b.slice/a-b-c.slice
    (systemd's rule: each '-' nests one level; '-.slice' is the root), as the runtime's systemd driver places
    its scopes; an invalid name is InvalidArgument naming `field`."""
    from runtime.cgroups.systemd import expand_slice as runtime_expand_slice
    from runtime.errors import ConfigError
    try:
        return runtime_expand_slice(name)
    except ConfigError as e:
        raise invalid(field, e.reason) from None


def with_cgroups_path(spec: Spec, ctx: ContainerContext) -> None:
    systemd = ctx.host.systemd_cgroup
    parent = check_parent(ctx.sandbox.cgroup_parent or ctx.sandbox_config.linux.cgroup_parent, systemd)
    ensure(spec, "linux")["cgroupsPath"] = cgroups_path(parent, ctx.id, systemd)


def with_sandbox_resources(spec: Spec, ctx: SandboxContext) -> None:
    systemd = ctx.host.systemd_cgroup
    parent = check_parent(ctx.config.linux.cgroup_parent, systemd)
    linux = ensure(spec, "linux")
    linux["cgroupsPath"] = cgroups_path(parent, ctx.id, systemd)
    ensure(linux, "resources", "cpu")["shares"] = SANDBOX_CPU_SHARES


# Sysctls that belong to a namespace the pod may not own (host network / host IPC).
_IPC_SYSCTLS = ("kernel.msgmax", "kernel.msgmnb", "kernel.msgmni", "kernel.sem", "kernel.shmall",
                "kernel.shmmax", "kernel.shmmni", "kernel.shm_rmid_forced")


def with_sysctls(spec: Spec, ctx: SandboxContext) -> None:
    """Pod sysctls go to the sandbox (its namespaces are the pod's); a net.* sysctl with host network or an
    IPC sysctl with host IPC would change the node, and is refused."""
    ns = ctx.config.linux.security_context.namespace_options
    out = {}
    for k, v in ctx.config.linux.sysctls.items():
        field = f"config.linux.sysctls[{k}]"
        name = k.replace("/", ".")
        if not re.match(r"^[a-z0-9_]+(\.[a-zA-Z0-9_\-]+)+$", name):
            raise invalid(field, "not a sysctl name")
        if ns.network == pb.NODE and name.startswith("net."):
            raise invalid(field, "net.* sysctls are not allowed with host network")
        if ns.ipc == pb.NODE and (name in _IPC_SYSCTLS or name.startswith("fs.mqueue.")):
            raise invalid(field, "IPC sysctls are not allowed with host IPC")
        out[name] = v
    if out:
        ensure(spec, "linux")["sysctl"] = out
