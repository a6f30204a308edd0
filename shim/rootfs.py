"""Mounts the rootfs that containerd passes in CreateTaskRequest.rootfs onto <bundle>/rootfs, and undoes it.

Owns only the order and the undo of containerd's Mount records; what their options mean to mount(2) is
runtime/mountopts.py's, everything else about the rootfs is the runtime's.
"""
from __future__ import annotations

import os

from runtime import mountopts
from runtime.linux import syscalls as sc
from shim.log import get as get_logger

log = get_logger(__name__)


def mount_rootfs(bundle: str, mounts: list) -> str:
    """Mounts each of `mounts` (containerd.types.Mount) in order on <bundle>/rootfs; returns that path."""
    target = os.path.join(bundle, "rootfs")
    os.makedirs(target, exist_ok=True)
    done = 0
    try:
        for m in mounts:
            if not m.type:
                raise ValueError(f"mount of {m.source!r}: no type")
            call = mountopts.mount_call(m.type, m.source, list(m.options))
            if call.data and len(call.data) >= 4096:
                raise ValueError(f"mount of {m.source!r}: options longer than a page ({len(call.data)} bytes)")
            mountopts.mount(call, target)
            done += 1
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
