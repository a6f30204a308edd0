"""The container's /dev: device nodes (the default set on a tmpfs /dev, then linux.devices), the standard
symlinks (/dev/fd, /dev/stdin...), /dev/ptmx on the devpts instance, and the pty bound on /dev/console.

Runs in the container init, inside its mount namespace, through the RootFs that rootfs.py builds: every path
is resolved inside the rootfs (openat2 RESOLVE_IN_ROOT). It does not decide what the device cgroup allows.
"""
from __future__ import annotations

import os
import stat
TYPE_CHECKING = False  # `typing` costs ~4 ms (it imports re): annotations only
if TYPE_CHECKING:
    from typing import Any

    from runtime.rootfs import RootFs

from runtime.config import DEFAULT_DEVICES
from runtime.errors import SetupError
from runtime.linux import syscalls as sc
from runtime.rootfs import create_file

DEV_SYMLINKS = [("/proc/self/fd", "/dev/fd"), ("/proc/self/fd/0", "/dev/stdin"),
                ("/proc/self/fd/1", "/dev/stdout"), ("/proc/self/fd/2", "/dev/stderr")]


def create_devices(fs: RootFs, devices: list[dict[str, Any]], *, dev_is_tmpfs: bool) -> None:
    old = os.umask(0)
    try:
        if dev_is_tmpfs:
            for path, major, minor in DEFAULT_DEVICES:
                _device(fs, {"path": path, "type": "c", "major": major, "minor": minor, "fileMode": 0o666,
                             "uid": 0, "gid": 0})
        for d in devices:
            _device(fs, d)
        if dev_is_tmpfs:
            for target, link in DEV_SYMLINKS:
                _symlink(fs, target, link)
            if os.path.exists("/proc/kcore"):
                _symlink(fs, "/proc/kcore", "/dev/core")
    finally:
        os.umask(old)


def setup_ptmx(fs: RootFs) -> None:
    """/dev/ptmx becomes a symlink to the devpts instance mounted at /dev/pts (newinstance)."""
    try:
        os.close(fs.open_in_root("/dev/pts/ptmx"))
    except OSError:
        return
    dfd = fs.ensure_dir("/dev")
    try:
        try:
            os.unlink("ptmx", dir_fd=dfd)
        except FileNotFoundError:
            pass
        os.symlink("pts/ptmx", "ptmx", dir_fd=dfd)
    finally:
        os.close(dfd)


def _symlink(fs: RootFs, target: str, link: str) -> None:
    parent, _, name = link.rpartition("/")
    dfd = fs.ensure_dir(parent)
    try:
        os.symlink(target, name, dir_fd=dfd)
    except FileExistsError:
        pass
    finally:
        os.close(dfd)


def _device(fs: RootFs, d: dict[str, Any]) -> None:
    path = os.path.normpath(d["path"])
    t = d["type"]
    mode = d.get("fileMode", 0o666) & 0o7777
    parent, _, name = path.rpartition("/")
    dfd = fs.ensure_dir(parent)
    try:
        try:
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise SetupError(f"linux.devices: {path} exists and is a directory") from None
        if t == "p":
            os.mkfifo(name, mode, dir_fd=dfd)
        elif fs.userns:
            # mknod is not allowed in a user namespace: bind the host's node onto an empty file
            fd = create_file(dfd, name)
            os.close(fd)
            tfd = sc.openat2(dfd, name, os.O_PATH, 0, sc.RESOLVE_IN_ROOT | sc.RESOLVE_NO_MAGICLINKS)
            try:
                sc.mount(path, f"/proc/self/fd/{tfd}", None, sc.MS_BIND)
            finally:
                os.close(tfd)
            return
        else:
            kind = stat.S_IFBLK if t == "b" else stat.S_IFCHR
            os.mknod(name, mode | kind, os.makedev(d["major"], d["minor"]), dir_fd=dfd)
        os.chown(name, d.get("uid", 0), d.get("gid", 0), dir_fd=dfd, follow_symlinks=False)
    except OSError as e:
        raise SetupError(f"create device {path}: {e.strerror}") from None
    finally:
        os.close(dfd)


def mount_console(fs: RootFs, slave_path: str) -> None:
    """Bind the pty slave onto /dev/console (runc does this for terminal containers)."""
    fd = fs.ensure_target("/dev/console", is_file=True)
    try:
        sc.mount(slave_path, f"/proc/self/fd/{fd}", None, sc.MS_BIND)
    finally:
        os.close(fd)
