"""A process in a cgroup with resources from a config.json `linux.resources` dict, driven by commands.

`ForkedWorkload` forks this test process, moves the child into a cgroup the manager created and configured, and
asks it (JSON lines over pipes) to open devices, allocate memory, fork. `tests/vm/container.py`'s
`ContainerWorkload` runs the same kinds of commands in a husk container built from a resources dict (a busybox
sh agent as its init).
"""
from __future__ import annotations

import errno
import json
import mmap
import os
import signal
import stat
from typing import Any, Callable, Protocol

from runtime.cgroups.manager import Manager

MAP_HUGETLB = 0x40000   # linux/mman.h (the mmap module does not export it)


class Workload(Protocol):
    manager: Manager
    pid: int

    def call(self, op: str, *args: Any) -> Any: ...

    def alive(self) -> bool: ...

    def wait(self) -> int: ...

    def close(self) -> None: ...


class Died(Exception):
    """The workload's process ended while a command was outstanding (e.g. OOM-killed)."""


# --- what the process inside the cgroup can be asked to do ---------------------------------------------------
_MODES = {"r": os.O_RDONLY, "w": os.O_WRONLY, "rw": os.O_RDWR}


def _op_open(path: str, mode: str) -> int:
    """0 if `path` opens in `mode`, else the errno."""
    try:
        os.close(os.open(path, _MODES[mode] | os.O_CLOEXEC))
        return 0
    except OSError as e:
        return e.errno


def _op_mknod(path: str, kind: str, major: int, minor: int) -> int:
    try:
        os.mknod(path, 0o600 | (stat.S_IFCHR if kind == "c" else stat.S_IFBLK), os.makedev(major, minor))
        os.unlink(path)
        return 0
    except OSError as e:
        return e.errno


def _op_alloc(nbytes: int) -> int:
    buf = bytearray(nbytes)
    for i in range(0, nbytes, 4096):   # touch every page so it is charged
        buf[i] = 1
    return len(buf)


def _op_fork(n: int) -> list[int]:
    """Forks up to n sleeping children; returns [forks that succeeded, errno of the first failure or 0]. The
    children are killed and reaped before returning."""
    kids, err = [], 0
    for _ in range(n):
        try:
            pid = os.fork()
        except OSError as e:
            err = e.errno
            break
        if pid == 0:
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            while True:
                signal.pause()
        kids.append(pid)
    for pid in kids:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return [len(kids), err]


_helpers: list[int] = []


def _op_spawn(kind: str) -> int:
    """Starts a long-lived helper in the cgroup: "spin" (busy loop) or "sleep"; returns its pid. It ends with
    the workload."""
    pid = os.fork()
    if pid == 0:
        if kind == "spin":
            while True:
                pass
        while True:
            signal.pause()
    _helpers.append(pid)
    return pid


def _op_hugetlb(nbytes: int) -> int:
    """0 if an anonymous huge-page mapping of nbytes can be made and touched, else the errno."""
    try:
        m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB)
    except OSError as e:
        return e.errno
    try:
        for i in range(0, nbytes, 2 << 20):
            m[i] = 1
    finally:
        m.close()
    return 0


def _op_read(path: str, nbytes: int) -> int:
    """Reads nbytes from the start of path with O_DIRECT (so the block layer sees it); returns bytes read."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
    try:
        buf = mmap.mmap(-1, 1 << 20)     # page-aligned, as O_DIRECT wants
        done = 0
        while done < nbytes:
            n = os.readv(fd, [memoryview(buf)[:min(1 << 20, nbytes - done)]])
            if n <= 0:
                break
            done += n
        buf.close()
        return done
    finally:
        os.close(fd)


OPS: dict[str, Callable[..., Any]] = {
    "ping": lambda: os.getpid(), "open": _op_open, "mknod": _op_mknod, "alloc": _op_alloc, "fork": _op_fork,
    "spawn": _op_spawn, "hugetlb": _op_hugetlb, "read": _op_read,
}


def _serve(cmd_fd: int, reply_fd: int) -> None:
    cmds = os.fdopen(cmd_fd, "r")
    for line in cmds:
        req = json.loads(line)
        try:
            reply = {"ok": OPS[req["op"]](*req["args"])}
        except Exception as e:  # noqa: BLE001 - every failure goes back to the test as text
            reply = {"error": f"{type(e).__name__}: {e}"}
        os.write(reply_fd, (json.dumps(reply) + "\n").encode())


class ForkedWorkload:
    """A forked child of the test process in the manager's cgroup. Order as a runtime does it: create the
    cgroup, set the resources, then move the (waiting) process in; it runs commands only after that."""

    def __init__(self, manager: Manager, resources: dict[str, Any] | None) -> None:
        self.manager = manager
        self._status: int | None = None
        manager.create()
        if resources is not None:
            manager.set(resources)
        cmd_r, cmd_w = os.pipe()
        reply_r, reply_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: wait until it is in the cgroup, then serve commands until the pipe closes
            code = 0
            try:
                for fd in (cmd_w, reply_r, go_w):
                    os.close(fd)
                os.read(go_r, 1)
                _serve(cmd_r, reply_w)
            except BaseException:  # noqa: BLE001 - the child must never return into pytest
                code = 1
            finally:
                for helper in _helpers:
                    try:
                        os.kill(helper, signal.SIGKILL)
                    except OSError:
                        pass
                os._exit(code)
        self.pid = pid
        for fd in (cmd_r, reply_w, go_r):
            os.close(fd)
        self._cmd = os.fdopen(cmd_w, "w", buffering=1)
        self._reply = os.fdopen(reply_r, "r")
        try:
            manager.apply(pid)
        finally:
            os.write(go_w, b"g")
            os.close(go_w)

    def call(self, op: str, *args: Any) -> Any:
        try:
            self._cmd.write(json.dumps({"op": op, "args": list(args)}) + "\n")
        except BrokenPipeError as e:
            raise Died(f"workload {self.pid} is gone") from e
        line = self._reply.readline()
        if not line:
            raise Died(f"workload {self.pid} died during {op}{tuple(args)}: {self.describe_exit()}")
        reply = json.loads(line)
        if "error" in reply:
            raise AssertionError(f"workload {op}{tuple(args)}: {reply['error']}")
        return reply["ok"]

    def alive(self) -> bool:
        if self._status is not None:
            return False
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid:
            self._status = status
        return not pid

    def wait(self) -> int:
        """Waits for the process to end; returns its raw wait status."""
        if self._status is None:
            self._status = os.waitpid(self.pid, 0)[1]
        return self._status

    def describe_exit(self) -> str:
        status = self.wait()
        if os.WIFSIGNALED(status):
            return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        return f"exited with {os.WEXITSTATUS(status)}"

    def close(self) -> None:
        """Ends the process (and its helpers) and removes the cgroup; safe to call twice."""
        for f in (self._cmd, self._reply):
            try:
                f.close()
            except OSError:
                pass
        if self._status is None:
            try:
                self.manager.kill_all(signal.SIGKILL)
            except Exception:  # noqa: BLE001 - clean-up must go on to reap and remove
                os.kill(self.pid, signal.SIGKILL)
            self.wait()
        self.manager.destroy()


def errno_name(code: int) -> str:
    return errno.errorcode.get(code, str(code))
