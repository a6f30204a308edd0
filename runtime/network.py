"""Brings the loopback interface up in a freshly created network namespace (runc does the same).

Runs in the container init; pod networking is done by CNI plugins elsewhere, never here.
"""
from __future__ import annotations

import _socket  # the C module: socket.py builds enums on import (~5 ms)
import fcntl
import struct

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def loopback_up() -> None:
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
    finally:
        s.close()
