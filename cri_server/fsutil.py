"""Host filesystem chores of pods and containers: mounting a tmpfs, unmounting, removing directories safely.

A directory is removed only when nothing is mounted below it (a recursive delete through a forgotten rootfs
or /dev/shm mount would destroy what the mount shows). Nothing here knows about CRI objects.
"""
from __future__ import annotations

import errno
import logging
import os
import shutil

from runtime import mountinfo
from runtime.linux import syscalls

log = logging.getLogger(__name__)


def mounts_under(path: str) -> list[str]:
    """Mount points at or below `path`, deepest first."""
    path = os.path.realpath(path).rstrip("/") or "/"
    out = {m.point for m in mountinfo.mounts_under(path)}
    return sorted(out, key=lambda p: p.count("/"), reverse=True)


def unmount_all(path: str) -> None:
    """Detaches every mount at or below `path` (idempotent)."""
    for mnt in mounts_under(path):
        try:
            syscalls.umount2(mnt, syscalls.MNT_DETACH)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOENT):
                raise OSError(e.errno, f"unmount {mnt}: {e.strerror}", mnt) from e


def remove_tree(path: str) -> None:
    """Unmounts what is mounted below `path`, then deletes it; refuses if a mount is still there."""
    if not os.path.lexists(path):
        return
    unmount_all(path)
    left = mounts_under(path)
    if left:
        raise OSError(errno.EBUSY, f"refusing to delete {path}: {left[0]} is still mounted", path)
    shutil.rmtree(path, ignore_errors=False, onerror=_ignore_missing)


def _ignore_missing(func: object, path: str, exc_info: tuple) -> None:  # type: ignore[type-arg]
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


def mount_tmpfs(target: str, options: str, flags: int = 0) -> None:
    os.makedirs(target, mode=0o755, exist_ok=True)
    syscalls.mount("shm", target, "tmpfs", flags, options)
