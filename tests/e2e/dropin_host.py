"""Host-state helpers for the drop-in tests: what a container left behind, and how to clean it up.

Owns reading /proc/self/mountinfo, /proc/<pid> and the cgroup trees, and undoing only what the tests made
(paths under their own temp dirs, cgroups under their own unique parents, processes they identified).
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from runtime.linux import syscalls
from tests.support.mountinfo import mounts_under
from tests.support.waiting import wait_for

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


def unmount_all_under(prefix: str | Path) -> list[str]:
    """Lazily unmount everything at or below prefix, deepest first; returns what was unmounted."""
    done = []
    for _ in range(5):  # a mount may be stacked several times on one point
        points = sorted(set(mounts_under(prefix)), key=lambda m: m.count("/"), reverse=True)
        if not points:
            break
        for m in points:
            try:
                syscalls.umount2(m, syscalls.MNT_DETACH)
                done.append(m)
            except OSError as e:
                log.warning("cleanup: umount %s: %s", m, e)
    return done


def cgroup_controller_dirs() -> list[Path]:
    """The mounted cgroup hierarchies (v1 controllers and the unified one), without the symlinked aliases."""
    out = []
    if not CGROUP_ROOT.is_dir():
        return out
    for entry in sorted(CGROUP_ROOT.iterdir()):
        if entry.is_symlink() or not entry.is_dir():
            continue
        if (entry / "cgroup.procs").exists():
            out.append(entry)
    if (CGROUP_ROOT / "cgroup.procs").exists():  # pure cgroup v2 host
        out.append(CGROUP_ROOT)
    return out


def cgroup_paths(rel: str) -> list[Path]:
    """Existing directories for cgroup path rel (e.g. /husk-dropin-x/id) in every hierarchy."""
    rel = rel.strip("/")
    return [d / rel for d in cgroup_controller_dirs() if (d / rel).is_dir()]


def remove_cgroup_tree(rel: str) -> list[str]:
    """Kill what is left inside the test's own cgroup rel, then rmdir it depth first. Returns the leftovers."""
    problems = []
    for top in cgroup_paths(rel):
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for d in dirs + [top]:
            try:
                pids = [int(x) for x in (d / "cgroup.procs").read_text().split()]
            except OSError:
                pids = []
            for pid in pids:
                # Only processes inside this test's unique cgroup: nothing else lives there.
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:   # killed processes leave the cgroup asynchronously
                wait_for(lambda: _rmdir(d), 5, f"{d} to be empty", interval=0.1)
            except AssertionError:
                problems.append(str(d))
    return problems


def _rmdir(d: Path) -> bool:
    """Removes the empty directory d: True once it is gone, False while it is busy."""
    try:
        d.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def process_cgroup(pid: int, controller: str) -> str | None:
    """The cgroup path of pid in a v1 controller (or the unified path when controller is '')."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(",") or (controller == "" and ctrls == ""):
            return path
    return None


@dataclass(frozen=True)
class ProcId:
    """A process identified by pid and start time, so a recycled pid is never mistaken for it."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> "ProcId":
        return cls(pid, _start_time(pid))

    def alive(self) -> bool:
        try:
            return _start_time(self.pid) == self.start and _state(self.pid) != "Z"
        except OSError:
            return False


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    # comm may contain spaces and parentheses: split after the last ')'.
    return data[data.rindex(")") + 2:].split()


def _start_time(pid: int) -> int:
    return int(_stat_fields(pid)[19])


def _state(pid: int) -> str:
    return _stat_fields(pid)[0]


def pids_with_cmdline(*needles: str) -> list[int]:
    """Pids whose command line contains every needle (used to find shims of this test's containerd)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(n in cmd for n in needles):
            out.append(int(entry))
    return out


def cmdline_arg(pid: int, flag: str) -> str | None:
    """The value after flag on pid's command line (e.g. a shim's -id), None if absent or gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    for i, a in enumerate(args[:-1]):
        if a == flag:
            return args[i + 1]
    return None


def stop_process(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """SIGTERM a process this test started (by its Popen), then SIGKILL if it does not exit."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_with_pty(argv: list[str], timeout: float = 60, env: dict[str, str] | None = None,
                 cwd: str | Path | None = None) -> tuple[int, str]:
    """Run argv with a new pseudo-terminal as stdin/stdout/stderr (ctr -t and podman -t insist on one).

    Returns the exit code and everything written to the terminal.
    """
    import pty
    import select

    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                                start_new_session=True, env=env, cwd=cwd)
    finally:
        os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                proc.kill()
                proc.wait()
                raise TimeoutError(f"{argv}: no exit within {timeout}s; output so far: {b''.join(chunks)!r}")
            ready, _, _ = select.select([master], [], [], min(left, 0.5))
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every slave end is closed
                    data = b""
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                # The child exited but a grandchild may still hold the slave: drain what is there.
                continue
        return proc.wait(timeout=max(1.0, deadline - time.monotonic())), b"".join(chunks).decode(errors="replace")
    finally:
        os.close(master)
