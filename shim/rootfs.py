"""Mounts the rootfs that containerd passes in CreateTaskRequest.rootfs onto <bundle>/rootfs, and undoes it.

Owns only the translation of containerd's Mount records (type, source, fstab-style options) to mount(2);
everything else about the rootfs is the runtime's.
"""
from __future__ import annotations

import os

from runtime.linux import syscalls as sc
from shim.log import get as get_logger

log = get_logger(__name__)

_FLAGS = {
    "ro": (sc.MS_RDONLY, True), "rw": (sc.MS_RDONLY, False),
    "nosuid": (sc.MS_NOSUID, True), "suid": (sc.MS_NOSUID, False),
    "nodev": (sc.MS_NODEV, True), "dev": (sc.MS_NODEV, False),
    "noexec": (sc.MS_NOEXEC, True), "exec": (sc.MS_NOEXEC, False),
    "noatime": (sc.MS_NOATIME, True), "relatime": (sc.MS_RELATIME, True),
    "nodiratime": (sc.MS_NODIRATIME, True), "sync": (sc.MS_SYNCHRONOUS, True),
    "bind": (sc.MS_BIND, True), "rbind": (sc.MS_BIND | sc.MS_REC, True),
    "defaults": (0, True),
}


def parse_options(options: list[str]) -> tuple[int, str]:
    flags = 0
    data = []
    for opt in options:
        if opt in _FLAGS:
            bit, on = _FLAGS[opt]
            flags = flags | bit if on else flags & ~bit
        else:
            data.append(opt)
    return flags, ",".join(data)


def mount_rootfs(bundle: str, mounts: list) -> str:
    """Mounts each of `mounts` (containerd.types.Mount) in order on <bundle>/rootfs; returns that path."""
    target = os.path.join(bundle, "rootfs")
    os.makedirs(target, exist_ok=True)
    done = 0
    try:
        for m in mounts:
            if not m.type:
                raise ValueError(f"mount of {m.source!r}: no type")
            flags, data = parse_options(list(m.options))
            if len(data) >= 4096:
                raise ValueError(f"mount of {m.source!r}: options longer than a page ({len(data)} bytes)")
            fstype = None if flags & sc.MS_BIND else m.type
            sc.mount(m.source, target, fstype, flags & ~sc.MS_RDONLY if flags & sc.MS_BIND else flags, data or None)
            done += 1
            if flags & sc.MS_BIND and flags & sc.MS_RDONLY:
                sc.mount(None, target, None, sc.MS_BIND | sc.MS_REMOUNT | sc.MS_RDONLY)
    except BaseException:
        for _ in range(done):
            unmount_rootfs(target)
        raise
    return target


def unmount_rootfs(target: str) -> None:
    try:
        sc.umount2(target, sc.MNT_DETACH)
    except OSError as err:
        log.warning("unmount %s: %s", target, err)
