"""Signal names and numbers as every layer spells them, turned into numbers: the one parser.

runc's `kill` ("KILL", "SIGKILL", "kill", "9"), CRI's Signal enum ("SIGTERM", "SIGRTMINPLUS3"), an image's
StopSignal and the config file ("SIGTERM", "TERM", "15", "SIGRTMIN+3", "RTMAX-2"). No I/O; `signal` (it
builds its enums on import) and nothing else only for a name, so `husk kill <pid> 9` stays a stdlib-only path.
"""
from __future__ import annotations

SIGRTMAX = 64  # Linux's _NSIG - 1 (glibc's SIGRTMAX): numbers run 1..64


def parse(name: str) -> int:
    """The signal number of `name`; ValueError names what was not understood."""
    s = name.strip().upper()
    if not s:
        raise ValueError("empty signal name")
    if s.isascii() and s.isdigit():
        n = int(s)
        if not 0 < n <= SIGRTMAX:
            raise ValueError(f"signal {name!r} out of range (1-{SIGRTMAX})")
        return n
    import signal
    if not s.startswith("SIG"):
        s = "SIG" + s
    if s.startswith("SIGRTM"):
        n = _realtime(s, name, signal)
        if n is not None:
            return n
    try:
        return int(signal.Signals[s])
    except KeyError:
        if s == "SIGCLD":
            return int(signal.SIGCHLD)
        raise ValueError(f"unknown signal {name!r}") from None


def _realtime(s: str, name: str, signal) -> int | None:  # type: ignore[no-untyped-def]
    """SIGRTMIN, SIGRTMAX, SIGRTMIN+3 / SIGRTMINPLUS3, SIGRTMAX-2 / SIGRTMAXMINUS2 (CRI's enum names)."""
    if s.startswith("SIGRTMIN"):
        n, rest = int(signal.SIGRTMIN), s[len("SIGRTMIN"):]
    elif s.startswith("SIGRTMAX"):
        n, rest = int(signal.SIGRTMAX), s[len("SIGRTMAX"):]
    else:
        return None
    if rest:
        for word, sign in (("+", 1), ("PLUS", 1), ("-", -1), ("MINUS", -1)):
            if rest.startswith(word) and rest[len(word):].isdigit():
                n += sign * int(rest[len(word):])
                break
        else:
            raise ValueError(f"unknown signal {name!r}")
    if not signal.SIGRTMIN <= n <= signal.SIGRTMAX:
        raise ValueError(f"signal {name!r} out of range")
    return n
