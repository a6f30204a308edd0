"""Spec options for cgroups and kernel parameters: cpu, memory, hugepages, unified, cgroupsPath, sysctls."""
from __future__ import annotations

import re

from cri_server.api.v1 import api_pb2 as pb
from cri_server.spec.context import ContainerContext, SandboxContext, Spec, ensure, invalid

# containerd's CPU shares for the pause container: it needs almost nothing.
SANDBOX_CPU_SHARES = 2
_CPUSET = re.compile(r"^(\d+(-\d+)?)(,\d+(-\d+)?)*$")
_PAGE_SIZE = re.compile(r"^\d+(KB|MB|GB|TB|PB)$")


def linux_resources(r: pb.LinuxContainerResources, field: str, swap_controller: bool) -> dict:
    """The OCI linux.resources object for CRI resources; zero means unset, negative is an error."""
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
        pages.append({"pageSize": h.page_size, "limit": h.limit})
    if pages:
        out["hugepageLimits"] = pages
    if r.unified:
        for k in r.unified:
            if "/" in k or k.startswith("."):
                raise invalid(f"{field}.unified", f"{k!r} is not a cgroup file name")
        out["unified"] = dict(r.unified)
    return out


def with_resources(spec: Spec, ctx: ContainerContext) -> None:
    res = linux_resources(ctx.config.linux.resources, "config.linux.resources", ctx.host.swap_controller)
    target = ensure(spec, "linux", "resources")
    target.update(res)


def cgroups_path(parent: str, object_id: str) -> str:
    """cgroupfs driver: <cgroup_parent>/<id>, absolute (kubelet sends /kubepods/... parents)."""
    parent = parent or "/husk"
    if not parent.startswith("/"):
        parent = "/" + parent
    return parent.rstrip("/") + "/" + object_id


def with_cgroups_path(spec: Spec, ctx: ContainerContext) -> None:
    parent = ctx.sandbox.cgroup_parent or ctx.sandbox_config.linux.cgroup_parent
    _check_parent(parent)
    ensure(spec, "linux")["cgroupsPath"] = cgroups_path(parent, ctx.id)


def _check_parent(parent: str) -> None:
    if parent.endswith(".slice"):
        raise invalid("config.linux.cgroup_parent",
                      f"{parent!r} is a systemd slice; husk-cri uses the cgroupfs driver (paths like /kubepods/x)")
    if ".." in parent.split("/"):
        raise invalid("config.linux.cgroup_parent", f"{parent!r} must not contain '..'")


def with_sandbox_resources(spec: Spec, ctx: SandboxContext) -> None:
    parent = ctx.config.linux.cgroup_parent
    _check_parent(parent)
    linux = ensure(spec, "linux")
    linux["cgroupsPath"] = cgroups_path(parent, ctx.id)
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
