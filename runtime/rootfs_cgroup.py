"""The OCI `cgroup` mount in the container's rootfs: on a cgroup2 host a cgroup2 mount (or a bind of the
container's own cgroup), on a v1/hybrid host a tmpfs with one mount per hierarchy.

Runs in the container init, inside its mount namespace, through the RootFs that rootfs.py builds (its
openat2-resolved targets); it never creates, changes or reads the limits of a cgroup (runtime/cgroups/ does).
"""
from __future__ import annotations

import errno
import os
TYPE_CHECKING = False  # `typing` costs ~4 ms (it imports re): annotations only
if TYPE_CHECKING:
    from runtime.mountinfo import Mount
    from runtime.mountopts import MountOptions
    from runtime.rootfs import RootFs

from runtime.errors import SetupError
from runtime.linux import syscalls as sc


def mount_cgroup(fs: RootFs, dest: str, opts: MountOptions) -> None:
    from runtime.cgroups import is_unified
    if is_unified():
        _cgroup2(fs, dest, opts)
    else:
        _cgroup_v1(fs, dest, opts)


def _cgroup2(fs: RootFs, dest: str, opts: MountOptions) -> None:
    """In a new cgroup namespace a fresh cgroup2 mount has the container's cgroup as its root. Without one a
    fresh mount would show the host's whole tree, so the container's own cgroup directory is bound instead;
    that is also the fallback where the kernel refuses the mount (a user namespace that does not own the cgroup
    namespace), as in runc."""
    from runtime.cgroups import CGROUP_ROOT
    fd = fs.ensure_target(dest, is_file=False)
    try:
        if fs.cgroupns:
            try:
                fs.mount_fs("cgroup", fd, dest, "cgroup2", opts)
                return
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.EBUSY):
                    raise
        src = CGROUP_ROOT + (fs.cgroup_path if fs.cgroup_path != "/" else "")
        try:
            sc.mount(src, f"/proc/self/fd/{fd}", None, sc.MS_BIND | sc.MS_REC)
        except OSError as e:
            raise OSError(e.errno, f"bind the container's cgroup {src} on {dest}: {os.strerror(e.errno)}") \
                from None
    finally:
        os.close(fd)
    flags = opts.flags & (sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC)
    if flags:
        fs.remount(dest, flags | sc.MS_BIND)


def _cgroup_v1(fs: RootFs, dest: str, opts: MountOptions) -> None:
    """A tmpfs with one directory per hierarchy (cgroupns aware)."""
    base = opts.flags & (sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC)
    fd = fs.ensure_target(dest, is_file=False)
    try:
        sc.mount("tmpfs", f"/proc/self/fd/{fd}", "tmpfs", base, "mode=755")
    finally:
        os.close(fd)
    # the tmpfs we just mounted, reached through an fd: nothing in it can be a hostile symlink, and no
    # symlink on the way to dest is followed again as a host path
    top_fd = fs.open_in_root(dest, os.O_PATH | os.O_DIRECTORY)
    try:
        _fill_v1(fs, f"/proc/self/fd/{top_fd}", base, opts)
    finally:
        os.close(top_fd)


def _fill_v1(fs: RootFs, top: str, base: int, opts: MountOptions) -> None:
    from runtime import mountinfo
    from runtime.cgroups.v1 import hierarchies
    mounts: dict[str, str] = {}
    for ctrl, mnt in hierarchies().items():
        if ctrl != "unified":  # as runc 1.1: the hybrid host's cgroup2 tree is not shown in the container
            mounts.setdefault(mnt, ctrl)
    table = mountinfo.read(fstypes=("cgroup",)) if fs.cgroupns else []
    for mnt in mounts:
        name = os.path.basename(mnt)
        sub = os.path.join(top, name)
        os.makedirs(sub, exist_ok=True)
        if fs.cgroupns:
            sc.mount("cgroup", sub, "cgroup", base, _hierarchy_options(mnt, table))
        else:
            src = mnt + (fs.cgroup_path if fs.cgroup_path != "/" else "")
            if not os.path.isdir(src):
                src = mnt
            sc.mount(src, sub, None, sc.MS_BIND | sc.MS_REC)
            sc.mount(None, sub, None, sc.MS_BIND | sc.MS_REMOUNT | base)
        if "," in name:  # co-mounted controllers: cpu,cpuacct -> symlinks cpu and cpuacct
            for part in name.split(","):
                link = os.path.join(top, part)
                if not os.path.lexists(link):
                    os.symlink(name, link)
    if opts.flags & sc.MS_RDONLY:
        sc.mount_setattr(top, sc.MOUNT_ATTR_RDONLY, 0, recursive=True)


def _hierarchy_options(mnt: str, table: list[Mount]) -> str:
    """The v1 hierarchy's superblock options (its controllers, name=...) for a fresh mount of it."""
    from runtime.mountinfo import mount_at
    m = mount_at(mnt, table)
    if m is None or m.fstype != "cgroup":
        raise SetupError(f"no cgroup hierarchy mounted at {mnt}")
    return ",".join(o for o in m.super_options if o not in ("rw", "ro"))
