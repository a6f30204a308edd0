"""Spec options for namespaces: a sandbox creates them (or uses the node's), a container joins the sandbox's
by path, with its own choice of pid namespace (POD, CONTAINER, NODE or TARGET)."""
from __future__ import annotations

from typing import Callable, Iterable

from cri_server.api.v1 import api_pb2 as pb
from cri_server.spec.context import ContainerContext, SandboxContext, Spec, ensure, invalid
from runtime.config import IDMAP_ROOTFS_ANNOTATION as ROOTFS_IDMAP_ANNOTATION


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


# --- user namespaces (KEP-127, hostUsers: false) ------------------------------------------------------------
# mode NODE (or no userns_options): the node's user namespace, as before. mode POD: the pause container makes the
# pod's user namespace with kubelet's mappings (linux.uidMappings/gidMappings) and every container joins it by
# path; the rootfs and every bind mount are idmapped with the pod's mappings (the runtime does it: the
# org.husk.rootfs.idmap annotation and the `idmap` mount option, runtime/idmap.py), so files stored as root on
# the host are root's inside and what container root writes is stored as root. Only one uid and one gid range,
# starting at container id 0, as kubelet allocates them.
USERNS_FIELD = "config.linux.security_context.namespace_options.userns_options"


def pod_userns(config: pb.PodSandboxConfig) -> pb.UserNamespace | None:
    """The pod's user namespace options when it has its own (mode POD); None when it uses the node's."""
    ns = config.linux.security_context.namespace_options
    if not ns.HasField("userns_options") or ns.userns_options.mode == pb.NODE:
        return None
    return ns.userns_options


SYSTEM_ID_MAX = 999   # login.defs' default SYS_UID_MAX / SYS_GID_MAX: the node's own system users and groups


def _system_id_max(kind: str, path: str = "/etc/login.defs") -> int:
    """The last host id of the node's own system accounts ("uid_map" -> SYS_UID_MAX, "gid_map" -> SYS_GID_MAX)."""
    key = "SYS_UID_MAX" if kind == "uid_map" else "SYS_GID_MAX"
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == key and parts[1].isdigit():
                    return int(parts[1])
    except OSError:
        pass
    return SYSTEM_ID_MAX


def _own_ranges(kind: str) -> list[tuple[int, int]]:
    """(first, end) host id ranges of husk-cri's own user namespace ("uid_map" or "gid_map")."""
    out = []
    try:
        with open(f"/proc/self/{kind}") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3:
                    out.append((int(parts[1]), int(parts[1]) + int(parts[2])))
    except OSError:
        return [(0, 1 << 32)]
    return out


def check_userns(config: pb.PodSandboxConfig, field: str = USERNS_FIELD,
                 own_ranges: Callable[[str], list[tuple[int, int]]] = _own_ranges,
                 system_id_max: Callable[[str], int] = _system_id_max) -> None:
    """InvalidArgument (naming the field) for user namespace options husk-cri cannot honour safely."""
    ns = config.linux.security_context.namespace_options
    if not ns.HasField("userns_options"):
        return
    u = ns.userns_options
    if u.mode == pb.NODE:
        if u.uids or u.gids:
            raise invalid(field, "mode NODE uses the node's user namespace: uids/gids must be empty")
        return
    if u.mode in (pb.CONTAINER, pb.TARGET):
        raise invalid(f"{field}.mode", f"{pb.NamespaceMode.Name(u.mode)}: a pod's user namespace is POD (its own) "
                                       f"or NODE (the node's)")
    if u.mode != pb.POD:
        raise invalid(f"{field}.mode", f"unknown mode {u.mode}")
    for kind, maps, map_file in (("uids", u.uids, "uid_map"), ("gids", u.gids, "gid_map")):
        if len(maps) != 1:
            raise invalid(f"{field}.{kind}", f"{len(maps)} mappings: exactly one range is supported (kubelet's "
                                             f"allocation for the pod)")
        m = maps[0]
        where = f"{field}.{kind}[0]"
        if m.length == 0:
            raise invalid(f"{where}.length", "must not be 0")
        if m.container_id != 0:
            raise invalid(f"{where}.container_id", f"{m.container_id}: the range must start at container id 0 "
                                                   f"(root inside must be mapped)")
        first, end = m.host_id, m.host_id + m.length
        if end > 1 << 32:
            raise invalid(where, f"host ids {first}..{end - 1} go past the largest id")
        if first == 0:
            raise invalid(f"{where}.host_id", f"host ids 0..{end - 1} include the host's root (0): a pod's user "
                                              f"namespace must map only unprivileged host ids")
        sys_max = system_id_max(map_file)
        if first <= sys_max:
            raise invalid(f"{where}.host_id", f"host ids {first}..{end - 1} overlap the node's own system "
                                              f"{kind} 0..{sys_max} (login.defs SYS_{kind[0].upper()}ID_MAX): a pod "
                                              f"must not own a system account's files")
        if not any(lo <= first and end <= hi for lo, hi in own_ranges(map_file)):
            raise invalid(where, f"host ids {first}..{end - 1} are not all inside husk-cri's own user namespace "
                                 f"({map_file} ranges {own_ranges(map_file)})")
    for name in ("network", "pid", "ipc"):
        if getattr(ns, name) == pb.NODE:
            raise invalid(f"{field}.mode", f"POD: a pod with its own user namespace cannot use the node's {name} "
                                           f"namespace (namespace_options.{name} is NODE)")


def _mappings(maps: Iterable[pb.IDMapping]) -> list[dict[str, int]]:
    return [{"containerID": m.container_id, "hostID": m.host_id, "size": m.length} for m in maps]


def _idmap_binds(spec: Spec) -> None:
    """Every bind mount without mappings of its own is idmapped with the container's user namespace, but /dev/shm:
    the pod's tmpfs (mode 1777, writable as it is; tmpfs takes idmapped mounts only from Linux 6.3)."""
    for m in spec.get("mounts") or []:
        opts = m.get("options") or []
        is_bind = m.get("type") == "bind" or "bind" in opts or "rbind" in opts
        if m.get("destination") == "/dev/shm":
            continue
        if is_bind and not (m.get("uidMappings") or "idmap" in opts or "ridmap" in opts):
            m["options"] = [*opts, "idmap"]


def _userns_common(spec: Spec, entries: list[dict[str, str]]) -> None:
    namespaces = ensure(spec, "linux").setdefault("namespaces", [])
    have = {e["type"] for e in namespaces}
    namespaces.extend(e for e in entries if e["type"] not in have)
    if "cgroup" not in have:
        # the cgroup tree can be mounted only from a user namespace that owns a cgroup namespace
        namespaces.append({"type": "cgroup"})
    spec.setdefault("annotations", {})[ROOTFS_IDMAP_ANNOTATION] = "true"
    _idmap_binds(spec)


def with_sandbox_userns(spec: Spec, ctx: SandboxContext) -> None:
    """mode POD: the pause container makes the pod's user namespace (after the annotations option)."""
    check_userns(ctx.config)
    u = pod_userns(ctx.config)
    if u is None:
        return
    linux = ensure(spec, "linux")
    linux["uidMappings"] = _mappings(u.uids)
    linux["gidMappings"] = _mappings(u.gids)
    _userns_common(spec, [{"type": "user"}])


def with_container_userns(spec: Spec, ctx: ContainerContext) -> None:
    """mode POD: the container joins the pause container's user namespace; its own userns_options (kubelet
    repeats the pod's) must agree with the pod's."""
    u = pod_userns(ctx.sandbox_config)
    own = ctx.config.linux.security_context.namespace_options
    if own.HasField("userns_options"):
        mine = own.userns_options
        field = "config.linux.security_context.namespace_options.userns_options"
        if (mine.mode == pb.NODE) != (u is None):
            raise invalid(f"{field}.mode", f"{pb.NamespaceMode.Name(mine.mode)}, but the pod's user namespace is "
                                           f"{'the node' if u is None else 'its own (POD)'}'s")
        if u is not None and (list(mine.uids) != list(u.uids) or list(mine.gids) != list(u.gids)) and \
                (mine.uids or mine.gids):
            raise invalid(field, "the mappings differ from the pod's: a container shares its pod's user namespace")
    if u is None:
        return
    if ctx.sandbox.pid <= 0:
        raise invalid("sandbox", f"sandbox {ctx.sandbox.id} has no running pause process whose user namespace to "
                                 f"join")
    _userns_common(spec, [{"type": "user", "path": f"/proc/{ctx.sandbox.pid}/ns/user"}])
