"""The sync channel between the runtime (parent) and the processes it forks during create.

Two pipes carry short framed messages: a verb and an optional text ("pid 123", "error mount /proc: ...").
Owns only the framing; what each verb means is documented in parent.py.
"""
from __future__ import annotations

import os
import struct

from runtime.errors import SetupError


class Channel:
    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd = rfd
        self.wfd = wfd

    def send(self, verb: str, text: str = "") -> None:
        data = (verb + (" " + text if text else "")).encode()
        os.write(self.wfd, struct.pack("I", len(data)) + data)

    def recv(self) -> tuple[str, str]:
        """Returns (verb, text); ("eof", "") once every writer on the other side is gone."""
        head = _read_exact(self.rfd, 4)
        if head is None:
            return "eof", ""
        (n,) = struct.unpack("I", head)
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
