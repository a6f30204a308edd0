"""Pinned network namespaces: a namespace kept alive by a bind mount of its nsfs file, named by path.

Created in a short-lived thread that unshares CLONE_NEWNET for itself only, brings `lo` up there and
bind-mounts /proc/thread-self/ns/net onto the pin file. husk-cri runs gRPC threads, and forking a
threaded process is avoided (a child may inherit a lock another thread held); a network namespace is per thread, so a thread is enough and nothing is forked.
Removal unmounts (detached) and unlinks. This module does not run CNI plugins.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import struct
import threading

from runtime.linux import syscalls

log = logging.getLogger(__name__)

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def set_link_up(name: str = "lo") -> None:
    """Brings an interface of the calling thread's network namespace up (ioctl, no netlink library)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", name.encode(), 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", name.encode(), flags | IFF_UP))


def _pin_in_thread(path: str) -> None:
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        syscalls.unshare(syscalls.CLONE_NEWNET)
        try:
            set_link_up("lo")
            syscalls.mount("/proc/thread-self/ns/net", path, None, syscalls.MS_BIND)
        finally:
            # The thread ends right after, but return it to the daemon's namespace anyway: nothing the
            # thread does afterwards (e.g. logging to a socket) may land in the pod's namespace.
            syscalls.setns(own, syscalls.CLONE_NEWNET)
    finally:
        os.close(own)


def create(path: str) -> str:
    """Creates a new network namespace pinned at `path` (which must not exist) with `lo` up; returns path."""
    os.makedirs(os.path.dirname(path), mode=0o711, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
    os.close(fd)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            _pin_in_thread(path)
        except BaseException as e:  # noqa: BLE001 -- handed to the caller's thread below
            failure.append(e)

    t = threading.Thread(target=run, name="netns-pin")
    t.start()
    t.join()
    if failure:
        try:
            os.unlink(path)
        except OSError:
            pass
        e = failure[0]
        if isinstance(e, OSError):
            raise OSError(e.errno, f"create network namespace {path}: {e.strerror}", path) from e
        raise e
    log.debug("network namespace pinned", extra={"path": path})
    return path


def is_pinned(path: str) -> bool:
    """True while `path` is a live namespace pin, e.g. after a restart of husk-cri. Namespace files all live on
    the one nsfs superblock, so a pin has the same st_dev as our own /proc/self/ns/net."""
    try:
        return os.stat(path).st_dev == os.stat("/proc/self/ns/net").st_dev
    except OSError:
        return False


def remove(path: str) -> None:
    """Unpins and deletes; idempotent (a missing or already unmounted pin is fine)."""
    try:
        syscalls.umount2(path, syscalls.MNT_DETACH)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOENT):
            raise
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
