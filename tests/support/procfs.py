"""What ps and pgrep read of a process, from /proc."""
from __future__ import annotations


def comm(pid: int) -> str:
    """The process name (PR_SET_NAME, at most 15 bytes): what `pgrep -x` matches."""
    with open(f"/proc/{pid}/comm") as f:
        return f.read().rstrip("\n")


def args(pid: int) -> str:
    """The command line as `ps -o args` and `pgrep -f` see it: NULs as spaces, trailing ones dropped."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().rstrip(b"\0").replace(b"\0", b" ").decode()
