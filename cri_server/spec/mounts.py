"""Spec options for the filesystem view: default mounts, the pod's files and /dev/shm, CRI volumes with
propagation and read-only, the termination message file, and devices.

Only builds the spec; it creates nothing on the host except, like containerd, a missing hostPath
directory and the termination message file in husk's own container directory.
"""
from __future__ import annotations

import logging
import os
import stat
from typing import Any

from cri_server.api.v1 import api_pb2 as pb
from cri_server.errors import Unimplemented
from cri_server.spec.context import ContainerContext, SandboxContext, Spec, ensure, invalid

DEFAULT_MOUNTS: tuple[dict[str, Any], ...] = (
    {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
     "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
    {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
     "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
    {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
     "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
)
PRIVATE_SHM = {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}

_PROPAGATION = {pb.PROPAGATION_PRIVATE: "rprivate", pb.PROPAGATION_HOST_TO_CONTAINER: "rslave",
                pb.PROPAGATION_BIDIRECTIONAL: "rshared"}
TERMINATION_MESSAGE_ANNOTATION = "io.kubernetes.container.terminationMessagePath"

log = logging.getLogger(__name__)


def _put_mount(spec: Spec, mount: dict[str, Any]) -> None:
    """Adds a mount, replacing any earlier one at the same destination (the later source wins)."""
    mounts = spec.setdefault("mounts", [])
    dest = os.path.normpath(mount["destination"])
    spec["mounts"] = [m for m in mounts if os.path.normpath(m["destination"]) != dest] + [mount]


def _bind(dest: str, source: str, readonly: bool, propagation: str = "rprivate") -> dict[str, Any]:
    return {"destination": dest, "type": "bind", "source": source,
            "options": ["rbind", propagation, "ro" if readonly else "rw"]}


def with_default_mounts(spec: Spec, ctx: ContainerContext | SandboxContext) -> None:
    privileged = _is_privileged(ctx)
    for m in DEFAULT_MOUNTS:
        m = {**m, "options": list(m["options"])}
        if privileged and m["type"] in ("sysfs", "cgroup"):
            # A privileged container may write /sys and its cgroups, as with containerd.
            m["options"] = [o for o in m["options"] if o != "ro"] + ["rw"]
        _put_mount(spec, m)


def _is_privileged(ctx: ContainerContext | SandboxContext) -> bool:
    if isinstance(ctx, ContainerContext):
        return ctx.config.linux.security_context.privileged
    return ctx.config.linux.security_context.privileged


def with_sandbox_shm(spec: Spec, ctx: SandboxContext) -> None:
    """The pod's /dev/shm: the host's with host IPC, else the pod's own tmpfs (shared by its containers)."""
    if ctx.config.linux.security_context.namespace_options.ipc == pb.NODE:
        _put_mount(spec, _bind("/dev/shm", "/dev/shm", False))
    elif ctx.shm_path:
        _put_mount(spec, _bind("/dev/shm", ctx.shm_path, False))
    else:
        _put_mount(spec, {**PRIVATE_SHM, "options": list(PRIVATE_SHM["options"])})


def with_pod_files(spec: Spec, ctx: ContainerContext) -> None:
    """/etc/hosts, /etc/resolv.conf, /etc/hostname and /dev/shm from the sandbox; read-only when the rootfs is."""
    ro = ctx.config.linux.security_context.readonly_rootfs
    sb = ctx.sandbox
    for dest, src in (("/etc/hosts", sb.hosts_path), ("/etc/resolv.conf", sb.resolv_path),
                      ("/etc/hostname", sb.hostname_path)):
        if src:
            _put_mount(spec, _bind(dest, src, ro))
    if ctx.sandbox_config.linux.security_context.namespace_options.ipc == pb.NODE:
        _put_mount(spec, _bind("/dev/shm", "/dev/shm", False))
    elif sb.shm_path:
        _put_mount(spec, _bind("/dev/shm", sb.shm_path, False))
    else:
        _put_mount(spec, {**PRIVATE_SHM, "options": list(PRIVATE_SHM["options"])})


def _check_propagation(i: int, source: str, propagation: int, mountinfo: str) -> None:
    """rshared needs the source on a shared mount, rslave on a shared or slave one (else it silently would
    not propagate); the error names the mount point to fix."""
    if propagation == pb.PROPAGATION_PRIVATE:
        return
    from runtime.mountinfo import mount_of, parse
    m = mount_of(source, parse(mountinfo))
    mnt, shared, slave = (m.point, m.shared, m.slave) if m is not None else ("", False, False)
    if propagation == pb.PROPAGATION_BIDIRECTIONAL and not shared:
        raise invalid(f"config.mounts[{i}].propagation",
                      f"{source} is on mount {mnt}, which is not shared (needed for PROPAGATION_BIDIRECTIONAL)")
    if propagation == pb.PROPAGATION_HOST_TO_CONTAINER and not (shared or slave):
        raise invalid(f"config.mounts[{i}].propagation",
                      f"{source} is on mount {mnt}, which is neither shared nor slave "
                      "(needed for PROPAGATION_HOST_TO_CONTAINER)")


def with_cri_mounts(spec: Spec, ctx: ContainerContext) -> None:
    """The request's volumes, parents before children; they replace default mounts at the same place."""
    mountinfo = None
    entries = []
    for i, m in enumerate(ctx.config.mounts):
        where = f"config.mounts[{i}]"
        if m.HasField("image") and m.image.image:
            raise Unimplemented(f"{where}.image: image volumes are not supported by husk-cri")
        if not m.container_path or not m.container_path.startswith("/"):
            raise invalid(f"{where}.container_path", f"{m.container_path!r} must be an absolute path")
        if not m.host_path or not m.host_path.startswith("/"):
            raise invalid(f"{where}.host_path", f"{m.host_path!r} must be an absolute path")
        if m.propagation not in _PROPAGATION:
            raise invalid(f"{where}.propagation", f"unknown value {m.propagation}")
        if bool(m.uidMappings) != bool(m.gidMappings):
            raise invalid(f"{where}.uidMappings", "an idmapped volume needs both uidMappings and gidMappings")
        if m.recursive_read_only:
            if not m.readonly:
                raise invalid(f"{where}.recursive_read_only", "requires readonly")
            if m.propagation != pb.PROPAGATION_PRIVATE:
                raise invalid(f"{where}.recursive_read_only", "requires PROPAGATION_PRIVATE")
        source = clean_host_path(m.host_path, ctx.id, where)
        if not os.path.lexists(source):
            if not ctx.make_host_dirs:
                raise invalid(f"{where}.host_path", f"{source} does not exist")
            try:
                os.makedirs(source, mode=0o755, exist_ok=True)
            except OSError as e:
                raise invalid(f"{where}.host_path", f"cannot create {source}: {e.strerror}") from None
        # Symlinks in the host path are resolved on the host, where kubelet made them.
        source = os.path.realpath(source)
        if not os.path.exists(source):
            raise invalid(f"{where}.host_path", f"{m.host_path} resolves to {source}, which does not exist")
        if m.propagation != pb.PROPAGATION_PRIVATE:
            if mountinfo is None:
                mountinfo = ctx.host.mountinfo()
            _check_propagation(i, source, m.propagation, mountinfo)
        options = ["rbind", _PROPAGATION[m.propagation], "ro" if m.readonly else "rw"]
        if m.recursive_read_only:
            options.append("rro")
        entry = {"destination": os.path.normpath(m.container_path), "type": "bind", "source": source,
                 "options": options}
        if m.uidMappings:
            # an idmapped volume with mappings of its own (the runtime makes it: runtime/idmap.py)
            entry["options"].append("idmap")
            entry["uidMappings"] = [{"containerID": x.container_id, "hostID": x.host_id, "size": x.length}
                                    for x in m.uidMappings]
            entry["gidMappings"] = [{"containerID": x.container_id, "hostID": x.host_id, "size": x.length}
                                    for x in m.gidMappings]
        entries.append(entry)
        if m.propagation == pb.PROPAGATION_BIDIRECTIONAL:
            # The runtime-spec's values (its schema has no r- forms); runtimes apply them recursively.
            ensure(spec, "linux")["rootfsPropagation"] = "shared"
        elif m.propagation == pb.PROPAGATION_HOST_TO_CONTAINER and \
                spec.get("linux", {}).get("rootfsPropagation") != "shared":
            ensure(spec, "linux")["rootfsPropagation"] = "slave"
    for e in sorted(entries, key=lambda e: e["destination"].count("/")):
        _put_mount(spec, e)


def clean_host_path(path: str, container_id: str, where: str) -> str:
    """`path` without `.`, `..` and doubled slashes, taken lexically as kubelet means it (its paths are clean
    already): `/a/b/../c` must not create /a/b when the directory is missing, nor follow b if it is a symlink."""
    clean = "/" + os.path.normpath(path).lstrip("/")
    if clean != path:
        log.info("%s.host_path %r taken as %s", where, path, clean, extra={"id": container_id})
    return clean


def with_termination_message(spec: Spec, ctx: ContainerContext) -> None:
    """kubelet names the termination message file in an annotation and usually mounts it itself; when no
    volume covers that path, the file lives in husk's container dir and is bind-mounted read-write."""
    path = ctx.config.annotations.get(TERMINATION_MESSAGE_ANNOTATION, "")
    if not path:
        return
    if not path.startswith("/"):
        raise invalid(f"config.annotations[{TERMINATION_MESSAGE_ANNOTATION}]", f"{path!r} must be absolute")
    if any(os.path.normpath(m["destination"]) == os.path.normpath(path) for m in spec.get("mounts", ())):
        return
    host_file = os.path.join(ctx.container_dir, "termination-log")
    os.makedirs(ctx.container_dir, mode=0o711, exist_ok=True)
    with open(host_file, "a"):
        pass
    _put_mount(spec, _bind(path, host_file, False))


def _device_entry(host_path: str, container_path: str) -> dict[str, Any] | None:
    st = os.stat(host_path)
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:
        return None
    return {"path": container_path, "type": kind, "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev),
            "fileMode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid}


def _allow(spec: Spec, dev: dict[str, Any], access: str) -> None:
    rules = ensure(spec, "linux", "resources").setdefault("devices", [])
    rules.append({"allow": True, "type": dev["type"], "major": dev["major"], "minor": dev["minor"],
                  "access": access})


def with_devices(spec: Spec, ctx: ContainerContext) -> None:
    """The request's devices (a device file, or a directory of them), each allowed in the device cgroup."""
    devices = ensure(spec, "linux").setdefault("devices", [])
    for i, d in enumerate(ctx.config.devices):
        where = f"config.devices[{i}]"
        perms = d.permissions or "rwm"
        if not perms or set(perms) - set("rwm"):
            raise invalid(f"{where}.permissions", f"{d.permissions!r}: only r, w and m are allowed")
        if not d.host_path.startswith("/") or not d.container_path.startswith("/"):
            raise invalid(where, "host_path and container_path must be absolute paths")
        try:
            src = os.path.realpath(d.host_path)
            if os.path.isdir(src):
                found = []
                for dirpath, _, files in os.walk(src):
                    for f in sorted(files):
                        hp = os.path.join(dirpath, f)
                        cp = os.path.join(d.container_path, os.path.relpath(hp, src))
                        e = _device_entry(hp, cp)
                        if e:
                            found.append(e)
            else:
                e = _device_entry(src, d.container_path)
                if e is None:
                    raise invalid(f"{where}.host_path", f"{d.host_path} is not a device")
                found = [e]
        except OSError as e:
            raise invalid(f"{where}.host_path", f"{d.host_path}: {e.strerror}") from None
        for e in found:
            devices.append(e)
            _allow(spec, e, perms)


# Host device dirs a privileged container does not get as device nodes (they are mounts of their own).
_SKIP_DEV_DIRS = {"pts", "shm", "mqueue", "fd"}


def host_devices(root: str = "/dev") -> list[dict[str, Any]]:
    out = []
    for dirpath, dirnames, files in os.walk(root):
        if dirpath == root:
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DEV_DIRS]
        for f in sorted(files):
            p = os.path.join(dirpath, f)
            try:
                if os.path.islink(p):
                    continue
                e = _device_entry(p, p)
            except OSError:
                continue
            if e:
                out.append(e)
    return out


def with_privileged_devices(spec: Spec, ctx: ContainerContext) -> None:
    """A privileged container sees every host device and may use all of them."""
    if not ctx.config.linux.security_context.privileged:
        return
    existing = {d["path"] for d in spec.get("linux", {}).get("devices", ())}
    devices = ensure(spec, "linux").setdefault("devices", [])
    devices.extend(d for d in host_devices() if d["path"] not in existing)
    ensure(spec, "linux", "resources")["devices"] = [{"allow": True, "access": "rwm"}]
