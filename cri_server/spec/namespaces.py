"""Spec options for namespaces: a sandbox creates them (or uses the node's), a container joins the sandbox's
by path, with its own choice of pid namespace (POD, CONTAINER, NODE or TARGET)."""
from __future__ import annotations

from cri_server.api.v1 import api_pb2 as pb
from cri_server.spec.context import ContainerContext, SandboxContext, Spec, ensure, invalid


def _set(spec: Spec, entries: list[dict[str, str]]) -> None:
    ensure(spec, "linux")["namespaces"] = entries


def with_sandbox_namespaces(spec: Spec, ctx: SandboxContext) -> None:
    ns = ctx.config.linux.security_context.namespace_options
    entries = [{"type": "mount"}]
    if ns.network != pb.NODE:
        if not ctx.netns_path:
            raise invalid("sandbox", "no pinned network namespace for a pod without host network")
        entries.append({"type": "network", "path": ctx.netns_path})
        entries.append({"type": "uts"})
    if ns.ipc != pb.NODE:
        entries.append({"type": "ipc"})
    if ns.pid == pb.TARGET:
        raise invalid("config.linux.security_context.namespace_options.pid", "TARGET is only for containers")
    if ns.pid != pb.NODE:
        entries.append({"type": "pid"})
    _set(spec, entries)


def with_sandbox_hostname(spec: Spec, ctx: SandboxContext) -> None:
    """The pod's hostname lives in its UTS namespace; with host network the node's hostname is kept."""
    if ctx.config.linux.security_context.namespace_options.network != pb.NODE and ctx.config.hostname:
        spec["hostname"] = ctx.config.hostname
    else:
        spec.pop("hostname", None)


def with_container_namespaces(spec: Spec, ctx: ContainerContext) -> None:
    pod_ns = ctx.sandbox_config.linux.security_context.namespace_options
    own = ctx.config.linux.security_context.namespace_options
    pause = f"/proc/{ctx.sandbox.pid}/ns" if ctx.sandbox.pid > 0 else ""
    entries = [{"type": "mount"}]

    def join(kind: str, proc_name: str) -> None:
        if not pause:
            raise invalid("sandbox", f"sandbox {ctx.sandbox.id} has no running pause process to join")
        entries.append({"type": kind, "path": f"{pause}/{proc_name}"})

    if pod_ns.network != pb.NODE:
        if ctx.sandbox.netns_path:
            entries.append({"type": "network", "path": ctx.sandbox.netns_path})
        else:
            join("network", "net")
        join("uts", "uts")
    if pod_ns.ipc != pb.NODE:
        join("ipc", "ipc")
    field = "config.linux.security_context.namespace_options.pid"
    if own.pid == pb.POD:
        if pod_ns.pid == pb.NODE:
            raise invalid(field, "POD, but the sandbox uses the node's pid namespace")
        join("pid", "pid")
    elif own.pid == pb.CONTAINER:
        entries.append({"type": "pid"})
    elif own.pid == pb.TARGET:
        if not own.target_id:
            raise invalid(f"{field}", "TARGET needs namespace_options.target_id")
        if ctx.target_pid <= 0:
            raise invalid("config.linux.security_context.namespace_options.target_id",
                          f"container {own.target_id!r} is not running")
        entries.append({"type": "pid", "path": f"/proc/{ctx.target_pid}/ns/pid"})
    elif own.pid != pb.NODE:
        raise invalid(field, f"unknown mode {own.pid}")
    _set(spec, entries)
