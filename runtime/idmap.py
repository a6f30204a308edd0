"""Idmapped mounts: the rootfs and bind mounts seen through a user namespace's id mappings.

Who does what: the kernel lets only a process with CAP_SYS_ADMIN in the user namespace that owns a filesystem
(the host's, for every filesystem the runtime binds) idmap a mount of it, so the container init, which lives in
the container's user namespace, cannot. As runc 1.2 does, the runtime parent (host user namespace) makes each
idmapped mount detached: open_tree(OPEN_TREE_CLONE) of the source, then mount_setattr(MOUNT_ATTR_IDMAP) with the
user namespace's fd; it passes the fds to the init over a socket (SCM_RIGHTS), and the init attaches each one in
its place in the mount order with move_mount (rootfs.py). Which user namespace:
- a mount with its own `uidMappings`/`gidMappings`: a throwaway user namespace made with those mappings;
- a mount with the `idmap`/`ridmap` option and no mappings, and the rootfs when the config carries the
  annotation ROOTFS_ANNOTATION="true": the container's own (new, once its maps are written, or joined by path).
`idmap` idmaps the top mount only, `ridmap` every mount of an rbind. A mapping entry "containerID hostID size"
shows a file stored with id containerID as hostID to the host (so as containerID inside a container whose user
namespace has that same mapping).
"""
from __future__ import annotations

import errno
import os
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

from runtime.errors import SetupError
from runtime.linux import syscalls as sc

# Whether a config wants idmapped mounts is decided in runtime.config (every create loads it), so this module
# is imported only by containers that have them.
from runtime.config import IDMAP_ROOTFS_ANNOTATION as ROOTFS_ANNOTATION, mount_idmap, rootfs_idmap_wanted as rootfs_wanted

ROOT_KEY = "root"
MAX_FDS = 200  # per message (the kernel's SCM_MAX_FD is 253)


def prepare(raw: dict[str, Any], bundle: str, rootfs: str, userns_path: str | None) -> dict[str, int]:
    """Makes every idmapped mount the config asks for, detached; returns {"root" or str(mount index): fd}.
    `userns_path` names the container's user namespace (None: it has none)."""
    if os.geteuid() != 0:
        raise SetupError("idmapped mounts need a runtime running as root in the host's user namespace "
                         "(the kernel lets only the filesystem's owner idmap it)")
    made: dict[str, int] = {}
    userns: dict[str, int] = {}
    try:
        def container_userns(what: str) -> int:
            if userns_path is None:
                raise SetupError(f"{what}: idmapped with the container's mappings, but the container has no user "
                                 f"namespace")
            if "container" not in userns:
                try:
                    userns["container"] = os.open(userns_path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as e:
                    raise SetupError(f"{what}: open the container's user namespace {userns_path}: "
                                     f"{e.strerror}") from None
            return userns["container"]

        if rootfs_wanted(raw):
            what = f"root.path {rootfs} (annotation {ROOTFS_ANNOTATION})"
            made[ROOT_KEY] = idmapped_rootfs(rootfs, container_userns(what), what)
        for i, m in enumerate(raw.get("mounts") or []):
            kind = mount_idmap(m)
            if kind is None:
                continue
            what = f"mounts[{i}] ({m.get('destination')})"
            src = m.get("source") or ""
            if not os.path.isabs(src):
                src = os.path.join(bundle, src)
            if m.get("uidMappings") or m.get("gidMappings"):
                import json  # not at module level: json imports re (~8 ms), only mappings of their own need it
                key = json.dumps([m.get("uidMappings") or [], m.get("gidMappings") or []], sort_keys=True)
                if key not in userns:
                    userns[key] = userns_with(m.get("uidMappings") or [], m.get("gidMappings") or [], what)
                ns_fd = userns[key]
            else:
                ns_fd = container_userns(what)
            opts = m.get("options") or []
            made[str(i)] = clone_idmapped(src, ns_fd, tree="rbind" in opts, recursive=kind == "ridmap", what=what)
    except BaseException:
        for fd in made.values():
            os.close(fd)
        raise
    finally:
        for fd in userns.values():
            os.close(fd)
    return made


def clone_idmapped(path: str, userns_fd: int, *, tree: bool, recursive: bool, what: str) -> int:
    """A detached bind of `path` (with its submounts when `tree`) idmapped through `userns_fd` (the submounts too
    when `recursive`); returns its fd."""
    flags = sc.OPEN_TREE_CLONE | sc.OPEN_TREE_CLOEXEC | (sc.AT_RECURSIVE if tree else 0)
    try:
        fd = sc.open_tree(-100, path, flags)
    except OSError as e:
        if e.errno == errno.ENOSYS:
            raise SetupError(f"{what}: idmapped mounts need open_tree/mount_setattr (Linux 5.12 or later)") from None
        raise SetupError(f"{what}: clone {path}: {os.strerror(e.errno)}") from None
    try:
        sc.mount_setattr("", sc.MOUNT_ATTR_IDMAP, 0, recursive=recursive, dirfd=fd, userns_fd=userns_fd)
    except OSError as e:
        os.close(fd)
        raise SetupError(f"{what}: idmap {path}: {_why(e.errno, path)}") from None
    return fd


def idmapped_rootfs(rootfs: str, userns_fd: int, what: str) -> int:
    """The rootfs idmapped, detached. Most filesystems take an idmapped bind; overlayfs does not (only its layers
    can be idmapped), so an overlay mounted on the rootfs is mounted again from idmapped binds of its layers, as
    containerd 2 does for its snapshots (_idmapped_overlay)."""
    try:
        return clone_idmapped(rootfs, userns_fd, tree=True, recursive=True, what=what)
    except SetupError:
        ovl = overlay_at(rootfs)
        if ovl is None:
            raise
    return _idmapped_overlay(ovl, userns_fd, what)


class Overlay:
    def __init__(self, lower: list[str], upper: str, work: str, options: list[str]) -> None:
        self.lower = lower
        self.upper = upper
        self.work = work
        self.options = options  # the others (uuid=on, redirect_dir=..., ...), passed on as they are


def overlay_at(path: str) -> Overlay | None:
    """The overlay mounted exactly at `path` (the topmost mount there), from /proc/self/mountinfo."""
    from runtime.mountinfo import mount_at
    m = mount_at(os.path.realpath(path))
    if m is None or m.fstype != "overlay":
        return None
    lower: list[str] = []
    upper = work = ""
    other = []
    for opt in m.super_options:
        key, _, value = opt.partition("=")
        if key == "lowerdir":
            lower.extend(value.split(":"))
        elif key == "lowerdir+":
            lower.append(value)
        elif key == "upperdir":
            upper = value
        elif key == "workdir":
            work = value
        elif key not in ("rw", "ro"):
            other.append(opt)
    if not lower:
        return None
    return Overlay(lower, upper, work, other)


def _idmapped_overlay(ovl: Overlay, userns_fd: int, what: str) -> int:
    """A detached overlay over idmapped binds of `ovl`'s layers (the upper and work dirs through one bind: the
    kernel wants them on the same mount). A forked helper in a private mount namespace attaches the binds and
    mounts the overlay (nothing shows on the host), clones it detached and sends us the clone; the overlay keeps
    its layers, so the helper's namespace may go. The upper dir is then used by two overlays (the host's view,
    left alone, and this one): the kernel warns "upperdir is in-use" and refuses only with index=on."""
    for p in [*ovl.lower, ovl.upper, ovl.work]:
        if any(c in p for c in ",:\\"):
            raise SetupError(f"{what}: overlay layer {p!r}: a path with ',', ':' or '\\' cannot be passed on")
    layers = list(ovl.lower)
    upper_base = os.path.commonpath([ovl.upper, ovl.work]) if ovl.upper else ""
    if upper_base:
        layers.append(upper_base)
    ids = root_ids(userns_fd, what)
    fds: list[int] = []
    try:
        for p in layers:
            fds.append(clone_idmapped(p, userns_fd, tree=False, recursive=False, what=f"{what}: overlay layer"))
        return _in_helper(lambda: _mount_overlay(ovl, fds, upper_base, ids), what)
    finally:
        for fd in fds:
            os.close(fd)


def _mount_overlay(ovl: Overlay, fds: list[int], upper_base: str, ids: tuple[int, int]) -> int:
    """In the helper (a private mount namespace of its own): returns the detached clone of the new overlay.
    overlayfs does its own work in the upper layer (the work dir, copy-up, whiteouts) with the credentials of
    whoever mounted it, and an idmapped upper layer takes only ids of its mapping: the helper mounts it as the
    container's root (`ids`, host ids) keeping every capability, so that this work is stored as root's."""
    sc.unshare(sc.CLONE_NEWNS)
    sc.mount(None, "/", None, sc.MS_REC | sc.MS_PRIVATE)
    # the layer mount points, on a tmpfs over a directory every host has, seen only in this namespace (nothing is
    # created on the host; the layers' own paths are not needed any more: their binds are fds already)
    top = next(d for d in ("/run", "/tmp", "/mnt", "/") if os.path.isdir(d))
    sc.mount("tmpfs", top, "tmpfs", 0, "mode=700")
    paths = []
    for i, fd in enumerate(fds):
        d = os.path.join(top, str(i))
        os.mkdir(d)
        sc.move_mount(fd, -100, d)
        paths.append(d)
    data = [f"lowerdir={':'.join(paths[:len(ovl.lower)])}"]
    if upper_base:
        base = paths[-1]
        data += [f"upperdir={os.path.join(base, os.path.relpath(ovl.upper, upper_base))}",
                 f"workdir={os.path.join(base, os.path.relpath(ovl.work, upper_base))}"]
    data += ovl.options
    merged = os.path.join(top, "merged")
    os.mkdir(merged)
    _become(*ids)
    sc.mount("overlay", merged, "overlay", 0, ",".join(data))
    return sc.open_tree(-100, merged, sc.OPEN_TREE_CLONE | sc.OPEN_TREE_CLOEXEC)


def _become(uid: int, gid: int) -> None:
    """setresuid/setresgid to the given ids, keeping every capability effective."""
    _, permitted, inheritable = sc.capget()
    sc.set_keepcaps(True)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    sc.capset(permitted, permitted, inheritable)


def root_ids(userns_fd: int, what: str) -> tuple[int, int]:
    """The host (uid, gid) of root in the user namespace `userns_fd`: read from inside it by a forked process
    (a map file read from inside its namespace names the parent namespace's ids)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            sc.setns(userns_fd, sc.CLONE_NEWUSER)
            out = []
            for kind in ("uid_map", "gid_map"):
                with open(f"/proc/self/{kind}") as f:
                    out.append(next((int(p[1]) for p in (line.split() for line in f) if p[0] == "0"), -1))
            os.write(w, f"{out[0]} {out[1]}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    try:
        data = os.read(r, 64).decode().split()
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    if len(data) != 2 or "-1" in data:
        raise SetupError(f"{what}: root (id 0) is not mapped in the container's user namespace")
    return int(data[0]), int(data[1])


def _in_helper(fn: "Any", what: str) -> int:
    """Runs fn() in a forked process and returns the fd it returns (passed over a socket)."""
    a, b = socketpair()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(a)
            try:
                fd = fn()
                send(b, {"fd": fd})
                code = 0
            except BaseException as e:  # noqa: BLE001 - reported to the parent, then exit
                send_error(b, f"{what}: {e}")
        finally:
            os._exit(code)
    os.close(b)
    try:
        got = receive(a)
    finally:
        os.waitpid(pid, 0)
    return got["fd"]


def _why(err: int, path: str) -> str:
    if err == errno.EINVAL:
        return (f"the kernel cannot idmap a mount of this filesystem ({fstype_of(path) or 'unknown type'}), or "
                f"the mount is idmapped already")
    if err == errno.EPERM:
        return "not permitted: the runtime is not the owner of the filesystem's user namespace"
    if err == errno.ENOSYS:
        return "this kernel has no mount_setattr (idmapped mounts need Linux 5.12 or later)"
    return os.strerror(err)


def fstype_of(path: str) -> str:
    """The filesystem type of the mount `path` is on (from /proc/self/mountinfo), "" if not found."""
    from runtime.mountinfo import mount_of
    try:
        m = mount_of(os.path.realpath(path))
    except OSError:
        return ""
    return m.fstype if m is not None else ""


def userns_with(uid_maps: list[dict[str, Any]], gid_maps: list[dict[str, Any]], what: str) -> int:
    """An fd on a new user namespace with these mappings, held by nothing else (a forked process unshares it,
    we write its maps and open it, then it exits)."""
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(ready_r)
            os.close(hold_w)
            try:
                sc.unshare(sc.CLONE_NEWUSER)
            except OSError as e:
                os.write(2, f"husk: {what}: unshare(CLONE_NEWUSER): {e.strerror}\n".encode())
                raise
            os.write(ready_w, b"1")
            os.read(hold_r, 1)  # until the parent closes its end
            code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(hold_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise SetupError(f"{what}: could not create a user namespace for the mount's mappings "
                             f"(unshare(CLONE_NEWUSER) failed)")
        for kind, maps in (("uid_map", uid_maps), ("gid_map", gid_maps)):
            lines = "".join(f"{m['containerID']} {m['hostID']} {m['size']}\n" for m in maps)
            try:
                with open(f"/proc/{pid}/{kind}", "w") as f:
                    f.write(lines)
            except OSError as e:
                raise SetupError(f"{what}: write the mount's {kind} {lines.strip()!r}: {e.strerror}") from None
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(hold_w)
        os.waitpid(pid, 0)


def probe(path: str) -> str:
    """"" when the kernel idmaps a bind of `path` (a throwaway mapping), else why not. For callers that must not
    fork (husk-cri's Status runs it in a subprocess: `python -m runtime.idmap PATH`)."""
    maps = [{"containerID": 0, "hostID": 65536, "size": 65536}]
    try:
        ns = userns_with(maps, maps, "user namespace probe")
        try:
            os.close(clone_idmapped(path, ns, tree=False, recursive=False, what=path))
        finally:
            os.close(ns)
    except (OSError, SetupError) as e:
        return str(e)
    return ""


# --- passing the fds to the init ----------------------------------------------------------------------
def socketpair() -> tuple[int, int]:
    """(parent end, init end), close-on-exec."""
    import socket
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    return a.detach(), b.detach()


def send(sock_fd: int, fds: dict[str, int]) -> None:
    import socket
    s = socket.socket(fileno=sock_fd)
    try:
        items = list(fds.items())
        if len(items) > MAX_FDS:
            raise SetupError(f"{len(items)} idmapped mounts: at most {MAX_FDS} are supported")
        import json
        socket.send_fds(s, [json.dumps([k for k, _ in items]).encode()], [fd for _, fd in items])
    finally:
        s.detach()


def send_error(sock_fd: int, message: str) -> None:
    import socket
    s = socket.socket(fileno=sock_fd)
    try:
        import json
        s.send(json.dumps({"error": message}).encode())
    except OSError:
        pass
    finally:
        s.detach()


def receive(sock_fd: int) -> dict[str, int]:
    """In the init: the fds the parent sent, by key; closes the socket."""
    import socket
    s = socket.socket(fileno=sock_fd)
    try:
        msg, fds, _, _ = socket.recv_fds(s, 65536, MAX_FDS)
    finally:
        s.close()
    if not msg:
        for fd in fds:
            os.close(fd)
        raise SetupError("idmapped mounts: the runtime exited before sending them")
    from runtime import jsonload
    data = jsonload.loads(msg)
    if isinstance(data, dict):
        for fd in fds:
            os.close(fd)
        raise SetupError(str(data.get("error")))
    if len(data) != len(fds):
        for fd in fds:
            os.close(fd)
        raise SetupError(f"idmapped mounts: got {len(fds)} fds for {len(data)} mounts")
    out = dict(zip(data, fds))
    for fd in out.values():
        os.set_inheritable(fd, False)
    return out


if __name__ == "__main__":
    import sys
    why = probe(sys.argv[1])
    print(why or "ok")
    sys.exit(1 if why else 0)
