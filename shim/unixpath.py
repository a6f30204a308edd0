"""bind/connect for unix socket paths longer than sun_path (108 bytes), through /proc/self/fd/<dirfd>.

Owns only that workaround; callers keep using plain paths (state dirs under containerd's bundle dirs
easily exceed the limit with 64-character ids).
"""
from __future__ import annotations

import os
import socket

_SUN_PATH_MAX = 107  # 108 bytes including the terminating NUL


def _via_dir(sock: socket.socket, path: str, op: str) -> None:
    parent, name = os.path.split(path)
    dfd = os.open(parent or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        getattr(sock, op)(f"/proc/self/fd/{dfd}/{name}")
    finally:
        os.close(dfd)


def bind_unix(sock: socket.socket, path: str) -> None:
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        sock.bind(path)
    else:
        _via_dir(sock, path, "bind")


def connect_unix(sock: socket.socket, path: str) -> None:
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        sock.connect(path)
    else:
        _via_dir(sock, path, "connect")


def socket_path(address: str) -> str:
    """`unix:///run/x.sock` or `/run/x.sock` -> `/run/x.sock`."""
    if address.startswith("unix://"):
        return address[len("unix://"):]
    if address.startswith("ttrpc+unix://"):
        return address[len("ttrpc+unix://"):]
    return address
