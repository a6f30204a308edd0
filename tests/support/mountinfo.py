"""The test process's mount table (/proc/self/mountinfo), for tests that check what is mounted where."""
from __future__ import annotations

from pathlib import Path

from runtime.mountinfo import unescape

__all__ = ["entries", "mount_points", "mounts_under", "unescape"]


def entries() -> list[list[str]]:
    """Every line of /proc/self/mountinfo, split on blanks (fields stay escaped)."""
    with open("/proc/self/mountinfo") as f:
        return [line.split() for line in f if line.strip()]


def mount_points() -> list[str]:
    """Every mount point in this process's mount namespace, in mount order."""
    return [unescape(f[4]) for f in entries()]


def mounts_under(prefix: str | Path) -> list[str]:
    """Mount points at or below `prefix` (a string prefix on a path boundary)."""
    p = str(prefix).rstrip("/")
    return [m for m in mount_points() if m == p or m.startswith(p + "/")]
