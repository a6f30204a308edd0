"""The container's filesystem: mount propagation, the config's mounts, pivot_root, masked/readonly paths.

Beside it: mountopts.py (what a mount option means), rootfs_cgroup.py (the `cgroup` mount type), devices.py
(/dev's nodes, symlinks, ptmx and console), sysctl.py (linux.sysctl), idmap.py (idmapped mounts, made by the
runtime parent and attached here).

Runs only in the container init, inside its new mount namespace (never in the runtime's own namespace).
Mount destinations are opened with openat2(RESOLVE_IN_ROOT) so a symlink in the rootfs cannot redirect a
mount onto the host.
"""
from __future__ import annotations

import errno
import os
import stat
TYPE_CHECKING = False  # `typing` costs ~4 ms (it imports re): annotations only
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

from runtime.errors import SetupError
from runtime.linux import syscalls as sc

# the one option table (runtime/mountopts.py); parse_options and MountOptions stay importable from here
from runtime.mountopts import MountOptions, parse_options  # noqa: F401

_KERNEL_FS_FLAGS = sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC

ROOT_PROPAGATION = {"private": sc.MS_PRIVATE, "shared": sc.MS_SHARED, "slave": sc.MS_SLAVE,
                    "unbindable": sc.MS_UNBINDABLE}

class RootFs:
    """Builds the mount tree under `rootfs` in the current (new) mount namespace."""

    def __init__(self, rootfs: str, bundle: str, *, userns: bool, cgroup_path: str, cgroupns: bool,
                 netns_new: bool, ipcns_new: bool, idmapped: dict[str, int] | None = None) -> None:
        self.rootfs = rootfs
        # detached idmapped mounts made by the runtime (runtime/idmap.py): "root" and str(mount index) -> fd
        self.idmapped = dict(idmapped or {})
        self.bundle = bundle
        self.userns = userns
        self.cgroup_path = cgroup_path
        self.cgroupns = cgroupns
        self.netns_new = netns_new
        self.ipcns_new = ipcns_new
        self.rootfd = -1

    # --- safe path handling -----------------------------------------------------------------
    # Every path below is resolved by the kernel from the rootfs fd with RESOLVE_IN_ROOT: a symlink, absolute or
    # full of "..", can only lead to somewhere inside the rootfs (as if the rootfs were "/", like runc's
    # securejoin), and a /proc magic link (/proc/self/fd/N, /proc/<pid>/root) is refused outright. The fds
    # returned are O_PATH and the mounts go through /proc/self/fd/N, so a symlink swapped in after the check
    # (the CVE-2021-30465 class) changes nothing: the mount lands on what was opened.
    _RESOLVE = sc.RESOLVE_IN_ROOT | sc.RESOLVE_NO_MAGICLINKS
    MAX_LINKS = 40  # as the kernel's own limit on symlinks in one lookup

    def host_path(self, dest: str) -> str:
        """Only for places that need a path string; the result is meaningful only for a dest just resolved."""
        return os.path.join(self.rootfs, dest.lstrip("/"))

    def open_in_root(self, dest: str, flags: int = os.O_PATH) -> int:
        rel = dest.lstrip("/") or "."
        try:
            return sc.openat2(self.rootfd, rel, flags, 0, self._RESOLVE)
        except OSError as e:
            raise OSError(e.errno, f"open {dest} inside the rootfs: {_why(e.errno)}", dest) from None

    def ensure_dir(self, dest: str) -> int:
        """mkdir -p `dest` inside the rootfs; returns an O_PATH fd on it. A dangling symlink on the way gets its
        target created (resolved inside the rootfs), as runc's securejoin + MkdirAll do."""
        pending = [p for p in dest.split("/") if p]
        walked: list[str] = []  # the components taken so far, as written: the kernel resolves them (rooted)
        fd = os.dup(self.rootfd)
        links = 0
        try:
            while pending:
                part = pending.pop(0)
                path = "/".join([*walked, part])
                try:
                    nfd = self._open(path, os.O_PATH | os.O_DIRECTORY, dest)
                except FileNotFoundError:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        target = self._dangling(fd, part, dest)
                        links += 1
                        if links > self.MAX_LINKS:
                            raise OSError(errno.ELOOP, f"{dest}: too many symbolic links", dest) from None
                        if target.startswith("/"):
                            walked = []
                        pending[:0] = [p for p in target.split("/") if p]
                        continue
                    nfd = self._open(path, os.O_PATH | os.O_DIRECTORY, dest)
                os.close(fd)
                fd = nfd
                walked.append(part)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def ensure_target(self, dest: str, is_file: bool, _links: int = 0) -> int:
        """Creates the mount point (a directory, or an empty file for file bind mounts) unless something is there
        already (a symlink is followed, inside the rootfs); returns an O_PATH fd on it."""
        parent, _, name = dest.rstrip("/").rpartition("/")
        if not name:
            return self.ensure_dir("/")
        pfd = self.ensure_dir(parent or "/")
        try:
            rel = "/".join(p for p in (parent.strip("/"), name) if p)
            try:
                return self._open(rel, os.O_PATH, dest)
            except FileNotFoundError:
                pass
            try:
                if is_file:
                    os.close(create_file(pfd, name))
                else:
                    os.mkdir(name, 0o755, dir_fd=pfd)
            except FileExistsError:
                # a dangling symlink (or, with O_NOFOLLOW, a symlink to something missing): make its target
                target = self._dangling(pfd, name, dest)
                if _links >= self.MAX_LINKS:
                    raise OSError(errno.ELOOP, f"{dest}: too many symbolic links", dest) from None
                where = target if target.startswith("/") else f"{parent}/{target}"
                return self.ensure_target(where, is_file, _links + 1)
            return self._open(rel, os.O_PATH, dest)
        finally:
            os.close(pfd)

    def _open(self, rel: str, flags: int, dest: str) -> int:
        try:
            return sc.openat2(self.rootfd, rel or ".", flags, 0, self._RESOLVE)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise OSError(e.errno, f"{dest} inside the rootfs: {_why(e.errno)}", dest) from None

    @staticmethod
    def _dangling(dirfd: int, name: str, dest: str) -> str:
        try:
            return os.readlink(name, dir_fd=dirfd)
        except OSError as e:
            raise OSError(e.errno, f"{dest}: {name!r} exists but cannot be opened: {e.strerror}", dest) from None

    # --- the steps ----------------------------------------------------------------------------
    def prepare_root(self, propagation: str | None) -> None:
        """Stops mounts leaking to the host, then makes the rootfs a mount point (pivot_root needs one)."""
        # Start from slave (the default, so host mounts still propagate in), or shared when asked (as runc: the
        # copies of the host's shared mounts stay peers of the originals, so a bidirectional volume keeps
        # propagating both ways), or private (private/unbindable: an unbindable tree cannot be bound). The
        # requested propagation is applied to the new root again after pivot_root (set_root_propagation).
        if propagation == "shared":
            flag = sc.MS_SHARED
        elif propagation in (None, "", "slave"):
            flag = sc.MS_SLAVE
        else:
            flag = sc.MS_PRIVATE
        sc.mount(None, "/", None, sc.MS_REC | flag)
        if flag == sc.MS_SHARED:
            # pivot_root refuses a shared parent mount, and the bind below must not propagate out of it
            _make_parent_private(self.rootfs)
        root_fd = self.idmapped.pop("root", -1)
        if root_fd >= 0:
            # the rootfs seen through the container's id mappings (runtime/idmap.py)
            try:
                sc.move_mount(root_fd, -100, self.rootfs)
            except OSError as e:
                raise SetupError(f"attach the idmapped rootfs on {self.rootfs}: {os.strerror(e.errno)}") from None
            finally:
                os.close(root_fd)
        else:
            sc.mount(self.rootfs, self.rootfs, None, sc.MS_BIND | sc.MS_REC)
        self.rootfd = os.open(self.rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def mount_all(self, mounts: list[dict[str, Any]]) -> None:
        for i, m in enumerate(mounts):
            try:
                self.mount_one(m, i)
            except SetupError as e:
                raise SetupError(f"mounts[{i}] ({m.get('destination')}): {e}") from None
            except OSError as e:
                raise SetupError(f"mounts[{i}] ({m.get('destination')}): {e.strerror or e}") from None

    def mount_one(self, m: dict[str, Any], index: int = -1) -> None:
        dest = os.path.normpath(m["destination"])
        mtype = m.get("type") or ""
        opts = parse_options(m.get("options") or [])
        is_bind = mtype == "bind" or bool(opts.flags & sc.MS_BIND)
        idmapped = self.idmapped.pop(str(index), -1)
        if idmapped >= 0 and not is_bind:
            os.close(idmapped)
            raise SetupError("only a bind mount can be idmapped")
        if is_bind:
            self._bind(m, dest, opts, idmapped)
        elif mtype == "cgroup":
            from runtime.rootfs_cgroup import mount_cgroup
            mount_cgroup(self, dest, opts)
        else:
            if mtype == "proc" and os.path.islink(self.host_path(dest)):
                raise SetupError(f"proc destination {dest} is a symlink")
            if mtype in ("proc", "sysfs"):
                # whatever the config says: no setuid programs, device nodes or executables from the kernel's
                # own filesystems (a config that asks for suid/dev/exec there gets them refused, not granted)
                opts.flags |= _KERNEL_FS_FLAGS
                opts.clear &= ~_KERNEL_FS_FLAGS
            fd = self.ensure_target(dest, is_file=False)
            try:
                self._check_proc_target(fd, dest, mtype == "proc")
                self.mount_fs(m.get("source") or mtype, fd, dest, mtype, opts)
            finally:
                os.close(fd)
        self._after(dest, opts)

    # What may be mounted inside /proc: the files lxcfs emulates (runc's list); anything else there could hide
    # what the kernel reports or what masked/readonly paths protect (the CVE-2019-19921 class).
    PROC_MOUNTABLE = ("cpuinfo", "diskstats", "meminfo", "stat", "swaps", "uptime", "loadavg", "slabinfo",
                      "net/dev", "sys/kernel/ns_last_pid")

    def _check_proc_target(self, fd: int, dest: str, is_proc: "bool | Callable[[], bool]") -> None:
        """Refuses a mount that lands in the container's /proc (wherever the symlinks on the way led), or a
        filesystem other than procfs on /proc itself. `is_proc` may be a callable (a bind source's mount-table
        lookup), asked only for a mount on /proc itself."""
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
            root = os.readlink(f"/proc/self/fd/{self.rootfd}")
        except OSError:
            return
        rel = os.path.relpath(where, root)
        if rel == "proc":
            if not (is_proc() if callable(is_proc) else is_proc):
                raise SetupError(f"{dest} resolves to /proc, where only a proc filesystem may be mounted")
        elif rel.startswith("proc/") and rel[len("proc/"):] not in self.PROC_MOUNTABLE:
            raise SetupError(f"{dest} resolves to /{rel}, inside /proc: only "
                             f"{', '.join('/proc/' + p for p in self.PROC_MOUNTABLE)} may be mounted there")

    def mount_fs(self, source: str, fd: int, dest: str, mtype: str, opts: MountOptions) -> None:
        data = ",".join(opts.data) or None
        flags = opts.flags & ~(sc.MS_BIND | sc.MS_REC | sc.MS_REMOUNT)
        target = f"/proc/self/fd/{fd}"
        try:
            sc.mount(source, target, mtype, flags, data)
        except OSError as e:
            # inside a user namespace the kernel refuses sysfs without a netns we own, mqueue without an ipc ns
            if e.errno == errno.EPERM and mtype == "sysfs" and (self.userns or not self.netns_new):
                sc.mount("/sys", target, None, sc.MS_BIND | sc.MS_REC)
                self.remount(dest, (flags | sc.MS_BIND) & ~sc.MS_REC)
                return
            if e.errno == errno.EPERM and mtype == "mqueue" and (self.userns or not self.ipcns_new):
                sc.mount("/dev/mqueue", target, None, sc.MS_BIND)
                self.remount(dest, flags | sc.MS_BIND)
                return
            raise OSError(e.errno, f"mount {mtype} on {dest}: {os.strerror(e.errno)}") from None

    def _bind(self, m: dict[str, Any], dest: str, opts: MountOptions, idmapped: int = -1) -> None:
        src = m["source"]
        if not os.path.isabs(src):
            src = os.path.join(self.bundle, src)
        try:
            try:
                st = os.fstat(idmapped) if idmapped >= 0 else os.stat(src)
            except OSError as e:
                raise SetupError(f"bind mount source {src}: {e.strerror}") from None
            fd = self.ensure_target(dest, is_file=not stat.S_ISDIR(st.st_mode))
            try:
                self._check_proc_target(fd, dest, lambda: _is_procfs(src))
                if idmapped >= 0:
                    # the detached idmapped clone of src the runtime made (runtime/idmap.py), attached on the fd
                    sc.move_mount(idmapped, fd)
                else:
                    sc.mount(src, f"/proc/self/fd/{fd}", None, sc.MS_BIND | (opts.flags & sc.MS_REC))
            finally:
                os.close(fd)
        finally:
            if idmapped >= 0:
                os.close(idmapped)
        extra = opts.flags & ~(sc.MS_BIND | sc.MS_REC | sc.MS_REMOUNT)
        if extra or opts.clear:
            self.remount(dest, extra | sc.MS_BIND)

    def remount(self, dest: str, flags: int) -> None:
        fd = self.open_in_root(dest)  # reopen: the fd must name the new mount, not the one under it
        try:
            target = f"/proc/self/fd/{fd}"
            if self.userns:
                flags |= _locked_flags(target)
            sc.mount(None, target, None, flags | sc.MS_REMOUNT)
        finally:
            os.close(fd)

    def _after(self, dest: str, opts: MountOptions) -> None:
        if not (opts.propagation or opts.attr_set or opts.attr_clr):
            return
        fd = self.open_in_root(dest)
        try:
            target = f"/proc/self/fd/{fd}"
            for p in opts.propagation:
                sc.mount(None, target, None, p)
            if opts.attr_set or opts.attr_clr:
                sc.mount_setattr(target, opts.attr_set, opts.attr_clr, recursive=True)
        finally:
            os.close(fd)

    def make_cwd(self, cwd: str) -> None:
        try:
            os.close(self.ensure_dir(cwd))
        except OSError as e:
            raise SetupError(f"process.cwd {cwd}: {_why(e.errno)}") from None

    def pivot(self, no_pivot: bool) -> None:
        if self.rootfd >= 0:
            os.close(self.rootfd)
            self.rootfd = -1
        if no_pivot:
            _hide_host_proc_sys(self.rootfs)
            os.chdir(self.rootfs)
            sc.mount(self.rootfs, "/", None, sc.MS_MOVE)
            os.chroot(".")
            os.chdir("/")
            return
        old = os.open("/", os.O_DIRECTORY | os.O_RDONLY | os.O_CLOEXEC)
        new = os.open(self.rootfs, os.O_DIRECTORY | os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fchdir(new)
            sc.pivot_root(".", ".")
            os.fchdir(old)
            # the old root must not propagate its unmount to the host
            sc.mount(None, ".", None, sc.MS_SLAVE | sc.MS_REC)
            sc.umount2(".", sc.MNT_DETACH)
        finally:
            os.close(old)
            os.close(new)
        os.chdir("/")


def _hide_host_proc_sys(rootfs: str) -> None:
    """Unmounts (or, where refused, covers with a tmpfs) every full procfs and sysfs mount of the host, as
    runc's msMoveRoot does before --no-pivot's MS_MOVE + chroot. Without pivot_root the host's mounts stay in
    the container's mount namespace, and a full, unmasked procfs there lets a nested user namespace mount a
    fresh procfs (the kernel allows it when one is already fully visible) past maskedPaths and readonlyPaths."""
    from runtime import mountinfo
    inside = os.path.realpath(rootfs).rstrip("/") + "/"
    points = [m.point for m in mountinfo.read()
              if m.root == "/" and m.fstype in ("proc", "sysfs") and not (m.point + "/").startswith(inside)]
    for point in points:
        try:
            sc.mount(None, point, None, sc.MS_SLAVE | sc.MS_REC)  # the unmount must not reach the host
            try:
                sc.umount2(point, sc.MNT_DETACH)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.EPERM):  # locked: inherited into a user namespace
                    raise
                sc.mount("tmpfs", point, "tmpfs", 0)
        except FileNotFoundError:
            continue  # below a mount detached already
        except OSError as e:
            raise SetupError(f"--no-pivot: hide the host's {point}: {e.strerror}") from None


# --- after pivot_root: paths are the container's own ---------------------------------------------
def readonly_path(path: str) -> None:
    try:
        sc.mount(path, path, None, sc.MS_BIND | sc.MS_REC)
    except FileNotFoundError:
        return
    except OSError as e:
        if e.errno == errno.ENOENT:
            return
        raise
    sc.mount(None, path, None, sc.MS_BIND | sc.MS_REMOUNT | sc.MS_RDONLY | sc.MS_REC | _locked_flags(path))


def mask_path(path: str) -> None:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISDIR(st.st_mode):
        sc.mount("tmpfs", path, "tmpfs", sc.MS_RDONLY, None)
    else:
        sc.mount("/dev/null", path, None, sc.MS_BIND)


def readonly_root() -> None:
    sc.mount(None, "/", None, sc.MS_BIND | sc.MS_REMOUNT | sc.MS_RDONLY | _locked_flags("/"))


def _make_parent_private(path: str) -> None:
    """Makes the mount that contains `path` private (not recursively), as runc's rootfsParentMountPrivate."""
    from runtime.mountinfo import mount_of
    m = mount_of(os.path.realpath(path))
    if m is not None and m.shared:
        sc.mount(None, m.point, None, sc.MS_PRIVATE)


def set_root_propagation(propagation: str) -> None:
    sc.mount(None, "/", None, sc.MS_REC | ROOT_PROPAGATION[propagation])


# --- helpers -------------------------------------------------------------------------------------
def create_file(dirfd: int, name: str) -> int:
    try:
        return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644,
                       dir_fd=dirfd)
    except FileExistsError:
        return os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dirfd)


def _is_procfs(path: str) -> bool:
    """A bind of a procfs (the host's /proc or a pid's): what may be bound on /proc itself, as runc allows."""
    from runtime.mountinfo import mount_of
    m = mount_of(os.path.realpath(path))
    return m is not None and m.fstype == "proc"


def _why(err: int) -> str:
    if err == errno.ELOOP:
        return "a component is a /proc magic link (e.g. /proc/self/fd/N) or a symlink loop, refused"
    if err == errno.EXDEV:
        return "a component leads out of the rootfs, refused"
    return os.strerror(err)


def _locked_flags(path: str) -> int:
    """nosuid/nodev/noexec/ro already set on a mount: a remount inside a user namespace must keep them."""
    f = os.statvfs(path).f_flag
    out = 0
    for st_flag, ms_flag in ((os.ST_NOSUID, sc.MS_NOSUID), (os.ST_NODEV, sc.MS_NODEV),
                             (os.ST_NOEXEC, sc.MS_NOEXEC)):
        if f & st_flag:
            out |= ms_flag
    return out
