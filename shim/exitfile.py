"""Durable exit records: one small JSON file per process in the shim's state dir, written atomically.

A client that reconnects after its own crash (or `containerd-shim-husk-v2 delete` after the shim's) reads
the exit status and time from here. Stdlib only.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ExitRecord:
    pid: int
    exit_status: int
    exited_at_ns: int
    oom_killed: bool = False


def path_for(state_dir: str, exec_id: str) -> str:
    return os.path.join(state_dir, f"exit-{exec_id}.json" if exec_id else "exit.json")


def write(state_dir: str, exec_id: str, rec: ExitRecord) -> None:
    target = path_for(state_dir, exec_id)
    tmp = f"{target}.tmp"
    data = json.dumps({"pid": rec.pid, "exit_status": rec.exit_status, "exited_at_ns": rec.exited_at_ns,
                       "oom_killed": rec.oom_killed}).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, target)


def read(state_dir: str, exec_id: str = "") -> ExitRecord | None:
    try:
        with open(path_for(state_dir, exec_id), "rb") as f:
            d = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (ValueError, OSError):
        return None
    return ExitRecord(int(d["pid"]), int(d["exit_status"]), int(d["exited_at_ns"]), bool(d.get("oom_killed")))


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
