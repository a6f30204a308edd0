"""The sync channel between the runtime (parent) and the processes it forks during create, and the start
socket between `start` and a created container's waiting init.

Two pipes carry short framed messages: a verb and an optional text ("pid 123", "error mount /proc: ...").
Owns only the framing; what each verb means is documented in parent.py.
"""
from __future__ import annotations

import os
import sys

from runtime.errors import SetupError


class Channel:
    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd = rfd
        self.wfd = wfd

    def send(self, verb: str, text: str = "") -> None:
        data = (verb + (" " + text if text else "")).encode()
        os.write(self.wfd, len(data).to_bytes(4, sys.byteorder) + data)  # struct "I" without importing struct

    def recv(self) -> tuple[str, str]:
        """Returns (verb, text); ("eof", "") once every writer on the other side is gone."""
        head = _read_exact(self.rfd, 4)
        if head is None:
            return "eof", ""
        n = int.from_bytes(head, sys.byteorder)
        body = _read_exact(self.rfd, n)
        if body is None:
            return "eof", ""
        verb, _, text = body.decode(errors="replace").partition(" ")
        return verb, text

    def expect(self, verb: str) -> str:
        got, text = self.recv()
        if got == verb:
            return text
        if got == "error":
            raise SetupError(text)
        if got == "eof":
            raise SetupError(f"the other side exited before sending {verb!r}")
        raise SetupError(f"sync protocol: expected {verb!r}, got {got!r}")

    def close(self) -> None:
        for fd in (self.rfd, self.wfd):
            if fd >= 0:
                os.close(fd)
        self.rfd = self.wfd = -1


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def pair() -> tuple[Channel, Channel]:
    """(parent side, child side); every fd is close-on-exec."""
    p2c_r, p2c_w = os.pipe()
    c2p_r, c2p_w = os.pipe()
    return Channel(c2p_r, p2c_w), Channel(p2c_r, c2p_w)


# The start socket: how `start` releases a created container's waiting init (runc uses a fifo, "exec.fifo").
# create binds and listens on <state dir>/exec.sock and the init inherits the listening fd; the init blocks in
# accept(), sends "0" on the connection and execs (the connection is close-on-exec: `start` reads EOF), or sends
# its error. Unlike a fifo, a socket cannot be opened through /proc/<init>/fd/N (ENXIO), nor connected to through
# that path: only a process that reaches the state dir's path, on the host, can start the container.
# `_socket` (the C module): `socket` builds enums on import.

def start_listener(path: str) -> int:
    """A listening unix socket bound at `path` (mode 0600); returns its close-on-exec fd."""
    import _socket
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        _at_path(path, s.bind)
        os.chmod(path, 0o600)
        s.listen(1)
    except BaseException:
        s.close()
        raise
    return s.detach()


def start_connect(path: str) -> int:
    """Connects to a waiting init's start socket; returns the connection's close-on-exec fd.
    ConnectionRefusedError when nobody listens any more (the init is gone)."""
    import _socket
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        _at_path(path, s.connect)
    except BaseException:
        s.close()
        raise
    return s.detach()


def start_accept(listen_fd: int) -> int:
    """In the init: blocks until `start` connects; closes the listening fd; returns the connection's fd
    (close-on-exec)."""
    import _socket
    s = _socket.socket(fileno=listen_fd)
    try:
        fd, _ = s._accept()
    finally:
        s.close()
    return fd


def _at_path(path: str, op: "object") -> None:
    # sun_path holds 108 bytes: a long state dir is reached through an fd on it
    if len(path.encode()) < 100:
        op(path)  # type: ignore[operator]
        return
    dfd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        op(f"/proc/self/fd/{dfd}/{os.path.basename(path)}")  # type: ignore[operator]
    finally:
        os.close(dfd)
