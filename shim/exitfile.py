"""Durable exit records: one small text file per process in the shim's state dir, written atomically.

A client that reconnects after its own crash (or `containerd-shim-husk-v2 delete` after the shim's) reads
the exit status and time from here. Stdlib only.
"""
from __future__ import annotations

import os

from shim.record import REQUIRED, Record


class ExitRecord(Record):
    __slots__ = ("pid", "exit_status", "exited_at_ns", "oom_killed")
    FIELDS = (("pid", REQUIRED), ("exit_status", REQUIRED), ("exited_at_ns", REQUIRED), ("oom_killed", False))


def path_for(state_dir: str, exec_id: str) -> str:
    return os.path.join(state_dir, f"exit-{exec_id}" if exec_id else "exit")


def write(state_dir: str, exec_id: str, rec: ExitRecord) -> None:
    from runtime.fsutil import atomic_write
    # One text line "pid exit_status exited_at_ns oom_killed": no json import in the shim. The file is fsync'd,
    # its directory not: an exit status matters to a shim restarted in this boot, not after a power loss.
    data = f"{rec.pid} {rec.exit_status} {rec.exited_at_ns} {1 if rec.oom_killed else 0}\n"
    atomic_write(path_for(state_dir, exec_id), data, mode=0o600, sync_dir=False)


def read(state_dir: str, exec_id: str = "") -> ExitRecord | None:
    try:
        with open(path_for(state_dir, exec_id), "rb") as f:
            pid, status, at, oom = f.read().split()
        return ExitRecord(int(pid), int(status), int(at), oom == b"1")
    except (OSError, ValueError):
        return None


def remove(state_dir: str, exec_id: str = "") -> None:
    try:
        os.unlink(path_for(state_dir, exec_id))
    except FileNotFoundError:
        pass


def status_from_wait(status: int) -> int:
    """waitpid status -> the exit status containerd reports (128+signal for a killed process)."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 255
