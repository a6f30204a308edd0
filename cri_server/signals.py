"""Signal names as CRI, image configs and config files spell them, turned into numbers.

CRI's Signal enum ("SIGTERM", "SIGRTMINPLUS3"), an image's StopSignal ("SIGTERM", "TERM", "15",
"SIGRTMIN+3"). No I/O.
"""
from __future__ import annotations

import re
import signal

_RT = re.compile(r"^(?:SIG)?RTM(IN|AX)(?:(?:PLUS|\+)(\d+)|(?:MINUS|-)(\d+))?$")


def parse(name: str) -> int:
    """The signal number of `name`; ValueError names what was not understood."""
    s = name.strip().upper()
    if not s:
        raise ValueError("empty signal name")
    if s.isdigit():
        n = int(s)
        if not 0 < n <= signal.SIGRTMAX:
            raise ValueError(f"signal {name!r} out of range")
        return n
    m = _RT.match(s)
    if m:
        base = signal.SIGRTMIN if m.group(1) == "IN" else signal.SIGRTMAX
        n = int(base) + int(m.group(2) or 0) - int(m.group(3) or 0)
        if not signal.SIGRTMIN <= n <= signal.SIGRTMAX:
            raise ValueError(f"signal {name!r} out of range")
        return n
    if not s.startswith("SIG"):
        s = "SIG" + s
    try:
        return int(signal.Signals[s])
    except KeyError:
        if s == "SIGCLD":
            return int(signal.SIGCHLD)
        raise ValueError(f"unknown signal {name!r}") from None
