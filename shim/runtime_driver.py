"""How the shim runs the OCI runtime: one interface, two implementations.

`BinaryRuntime` execs any runc-compatible binary (husk, runc, crun); `InProcessRuntime` forks the shim and
calls runtime.lifecycle directly (no new interpreter). Both leave the container's processes as children of
the (subreaper) shim. Neither reaps anything but the helper processes it starts itself.
"""
from __future__ import annotations

import os
import signal

from shim.record import REQUIRED, Record
from shim.stdio import ChildStdio

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any
from shim.log import get as get_logger

log = get_logger(__name__)


class RuntimeFailure(Exception):
    """The runtime refused or failed an operation; `not_found` when the container does not exist."""

    def __init__(self, op: str, container_id: str, message: str, not_found: bool = False) -> None:
        super().__init__(f"{op} {container_id}: {message}")
        self.op = op
        self.container_id = container_id
        self.message = message
        self.not_found = not_found


class RuntimeOptions(Record):
    __slots__ = ("root", "no_pivot", "no_new_keyring", "systemd_cgroup")
    FIELDS = (("root", REQUIRED), ("no_pivot", False), ("no_new_keyring", False), ("systemd_cgroup", False))


class RuntimeDriver:
    """The interface both drivers implement (documentation and isinstance checks; no typing.Protocol,
    which would import typing in every shim)."""
    name = ""

    def create(self, container_id: str, bundle: str, stdio: ChildStdio, pid_file: str) -> int: ...
    def start(self, container_id: str) -> None: ...
    def kill(self, container_id: str, sig: int, all: bool = False) -> None: ...
    def delete(self, container_id: str, force: bool = False) -> None: ...
    def exec(self, container_id: str, process: dict[str, Any], stdio: ChildStdio, pid_file: str) -> int: ...
    def pause(self, container_id: str) -> None: ...
    def resume(self, container_id: str) -> None: ...
    def update(self, container_id: str, resources: dict[str, Any]) -> None: ...
    def state(self, container_id: str) -> dict[str, Any]: ...
    def ps(self, container_id: str) -> list[int]: ...


def _read_pid(path: str) -> int:
    with open(path) as f:
        return int(f.read().strip())


def _not_found(text: str) -> bool:
    t = text.lower()
    return "does not exist" in t or "container not found" in t


class BinaryRuntime(RuntimeDriver):
    """A runc-compatible command line: `<binary> --root R --log L --log-format json <verb> ...`."""

    def __init__(self, binary: str, opts: RuntimeOptions, log_path: str) -> None:
        resolved = binary if os.path.isabs(binary) else _which(binary)
        if not resolved or not os.access(resolved, os.X_OK):
            raise RuntimeFailure("init", "", f"runtime binary {binary!r} not found or not executable")
        self.binary = resolved
        self.name = os.path.basename(resolved)
        self.opts = opts
        self.log_path = log_path

    def _global(self) -> list[str]:
        args = [self.binary, "--root", self.opts.root, "--log", self.log_path, "--log-format", "json"]
        if self.opts.systemd_cgroup:
            args.append("--systemd-cgroup")
        return args

    def _run(self, op: str, container_id: str, args: list[str], stdio: tuple[int, int, int] | None = None,
             input_data: bytes | None = None) -> bytes:
        """Runs the runtime and waits for it (only for it: the loop's reaper never sees this pid)."""
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        in_r = -1
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            if stdio is None:
                if input_data is not None:
                    in_r, in_w = os.pipe2(os.O_CLOEXEC)
                    os.write(in_w, input_data)   # small JSON: fits the pipe buffer
                    os.close(in_w)
                fds = (in_r if in_r >= 0 else devnull, out_w, out_w)
            else:
                fds = stdio
            actions = [(os.POSIX_SPAWN_DUP2, fds[0], 0), (os.POSIX_SPAWN_DUP2, fds[1], 1),
                       (os.POSIX_SPAWN_DUP2, fds[2], 2)]
            start_size = _log_size(self.log_path)
            pid = os.posix_spawn(self.binary, self._global() + args, _child_env(), file_actions=actions,
                                 setsigdef=(signal.SIGCHLD, signal.SIGPIPE, signal.SIGTERM))
        finally:
            os.close(out_w)
            os.close(devnull)
            if in_r >= 0:
                os.close(in_r)
        output = _read_to_end(out_r)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            msg = _last_log_error(self.log_path, start_size) or output.decode(errors="replace").strip()
            raise RuntimeFailure(op, container_id, msg or f"{self.name} exited with status {status}",
                                 _not_found(msg))
        return output

    def create(self, container_id: str, bundle: str, stdio: ChildStdio, pid_file: str) -> int:
        args = ["create", "--bundle", bundle, "--pid-file", pid_file]
        if stdio.console_socket:
            args += ["--console-socket", stdio.console_socket]
        if self.opts.no_pivot:
            args.append("--no-pivot")
        if self.opts.no_new_keyring:
            args.append("--no-new-keyring")
        self._run("create", container_id, args + [container_id], (stdio.stdin, stdio.stdout, stdio.stderr))
        return _read_pid(pid_file)

    def start(self, container_id: str) -> None:
        self._run("start", container_id, ["start", container_id])

    def kill(self, container_id: str, sig: int, all: bool = False) -> None:
        self._run("kill", container_id, ["kill"] + (["--all"] if all else []) + [container_id, str(sig)])

    def delete(self, container_id: str, force: bool = False) -> None:
        self._run("delete", container_id, ["delete"] + (["--force"] if force else []) + [container_id])

    def exec(self, container_id: str, process: dict[str, Any], stdio: ChildStdio, pid_file: str) -> int:
        import json
        spec_path = pid_file + ".process.json"
        fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(process, f)
            args = ["exec", "--process", spec_path, "--detach", "--pid-file", pid_file]
            if stdio.console_socket:
                args += ["--console-socket", stdio.console_socket]
            self._run("exec", container_id, args + [container_id], (stdio.stdin, stdio.stdout, stdio.stderr))
        finally:
            os.unlink(spec_path)
        return _read_pid(pid_file)

    def pause(self, container_id: str) -> None:
        self._run("pause", container_id, ["pause", container_id])

    def resume(self, container_id: str) -> None:
        self._run("resume", container_id, ["resume", container_id])

    def update(self, container_id: str, resources: dict[str, Any]) -> None:
        import json
        self._run("update", container_id, ["update", "--resources", "-", container_id],
                  input_data=json.dumps(resources).encode())

    def state(self, container_id: str) -> dict[str, Any]:
        import json
        return json.loads(self._run("state", container_id, ["state", container_id]))

    def ps(self, container_id: str) -> list[int]:
        import json
        out = self._run("ps", container_id, ["ps", "--format", "json", container_id])
        return [int(p) for p in (json.loads(out or b"[]") or [])]


class InProcessRuntime(RuntimeDriver):
    """husk's runtime called in-process: create/exec run in a forked child (they set up the container's
    stdio as fds 0-2 and may join namespaces), start too (`call_in_child`: memory); the other verbs are plain
    function calls."""

    name = "husk"

    def __init__(self, opts: RuntimeOptions) -> None:
        import runtime.lifecycle as lifecycle  # the runtime engineer's pinned API
        self.lc = lifecycle
        self.opts = opts

    def _call(self, op: str, container_id: str, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except Exception as err:
            raise RuntimeFailure(op, container_id, str(err),
                                 type(err).__name__ == "ContainerNotFound" or _not_found(str(err))) from err

    def _forked(self, op: str, container_id: str, stdio: ChildStdio, fn: Any, *args: Any, **kw: Any) -> None:
        pid, err_r, err_w = _fork_with_pipe()
        if pid == 0:  # child: never returns
            code = 1
            try:
                _child_of_the_shim(err_r)
                _keep_logging_off_container_stdio()
                os.dup2(stdio.stdin, 0)
                os.dup2(stdio.stdout, 1)
                os.dup2(stdio.stderr, 2)
                fn(*args, **kw)
                code = 0
            except BaseException as e:  # report anything to the parent, then exit
                try:
                    os.write(err_w, f"{type(e).__name__}\0{e}".encode()[:32768])  # fits the pipe
                except OSError:
                    pass
            finally:
                os._exit(code)
        os.close(err_w)
        # Wait for the child, not for EOF: the container's init inherits the pipe until it execs.
        _, status = os.waitpid(pid, 0)
        os.set_blocking(err_r, False)
        chunks = []
        try:
            chunks.append(os.read(err_r, 65536))
        except BlockingIOError:
            pass
        os.close(err_r)
        if os.waitstatus_to_exitcode(status) != 0:
            kind, _, msg = b"".join(chunks).decode(errors="replace").partition("\0")
            raise RuntimeFailure(op, container_id, msg or f"{op} child exited with status {status}",
                                 kind == "ContainerNotFound")

    def create(self, container_id: str, bundle: str, stdio: ChildStdio, pid_file: str) -> int:
        self._forked("create", container_id, stdio, self.lc.create, self.opts.root, container_id, bundle,
                     console_socket=stdio.console_socket, pid_file=pid_file, no_pivot=self.opts.no_pivot,
                     no_new_keyring=self.opts.no_new_keyring, systemd_cgroup=self.opts.systemd_cgroup)
        return _read_pid(pid_file)

    def start(self, container_id: str) -> None:
        # in a forked child: what the runtime's start reads and runs is not written in the long-lived shim
        # (-0.2 MB private per shim, shim/README.md "Memory")
        call_in_child("start", container_id, self.lc.start, self.opts.root, container_id)

    def kill(self, container_id: str, sig: int, all: bool = False) -> None:
        self._call("kill", container_id, self.lc.kill, self.opts.root, container_id, sig, all=all)

    def delete(self, container_id: str, force: bool = False) -> None:
        self._call("delete", container_id, self.lc.delete, self.opts.root, container_id, force=force)

    def exec(self, container_id: str, process: dict[str, Any], stdio: ChildStdio, pid_file: str) -> int:
        self._forked("exec", container_id, stdio, self.lc.exec_process, self.opts.root, container_id, process,
                     console_socket=stdio.console_socket, pid_file=pid_file, detach=True)
        return _read_pid(pid_file)

    def pause(self, container_id: str) -> None:
        self._call("pause", container_id, self.lc.pause, self.opts.root, container_id)

    def resume(self, container_id: str) -> None:
        self._call("resume", container_id, self.lc.resume, self.opts.root, container_id)

    def update(self, container_id: str, resources: dict[str, Any]) -> None:
        self._call("update", container_id, self.lc.update, self.opts.root, container_id, resources)

    def state(self, container_id: str) -> dict[str, Any]:
        return self._call("state", container_id, self.lc.state, self.opts.root, container_id)

    def ps(self, container_id: str) -> list[int]:
        fn = getattr(self.lc, "processes", None) or getattr(self.lc, "ps", None)
        if fn is None:
            raise RuntimeFailure("ps", container_id, "not provided by the in-process runtime")
        return [int(p) for p in self._call("ps", container_id, fn, self.opts.root, container_id)]


def _fork_with_pipe() -> tuple[int, int, int]:
    """os.fork with a close-on-exec pipe for the child to report on: (pid, read end, write end); both ends
    closed again when the fork fails."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        return os.fork(), r, w
    except OSError:
        os.close(r)
        os.close(w)
        raise


def _child_of_the_shim(read_end: int) -> None:
    """First steps of a forked child of the shim: the pipe's read end closed, SIGCHLD and SIGTERM back to their
    defaults (the shim's handlers only wake its loop) and the shim's signal wakeup fd let go of."""
    os.close(read_end)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)


def _read_to_end(fd: int) -> bytes:
    """Everything readable from `fd` until EOF (the writers closed it); closes it."""
    chunks = []
    try:
        while True:
            b = os.read(fd, 65536)
            if not b:
                return b"".join(chunks)
            chunks.append(b)
    finally:
        os.close(fd)


def call_in_child(op: str, container_id: str, fn: Any, *args: Any) -> bytes:
    """fn(*args) in a forked child of the shim; the bytes it returns (or b"" for None) come back over a pipe.
    RuntimeFailure when fn raised (its type and text) or the child died.

    For work whose effects are outside the shim's memory (files, cgroups, signals, an encoded answer): CPython
    writes into every object it runs or touches (reference counts, caches), which copies the object's page out
    of the memory a shim shares with the spawner, for the shim's lifetime; a child's copies end with it."""
    pid, r, wfd = _fork_with_pipe()
    if pid == 0:  # child: never returns
        code = 1
        try:
            _child_of_the_shim(r)
            out = fn(*args)
            view = memoryview(b"\1" + (out or b""))
            while view:
                view = view[os.write(wfd, view):]
            code = 0
        except BaseException as e:  # reported to the parent, then exit
            try:
                os.write(wfd, f"\0{type(e).__name__}\0{e}".encode()[:32768])
            except OSError:
                pass
        finally:
            os._exit(code)
    os.close(wfd)
    try:
        data = _read_to_end(r)
    finally:
        status = os.waitpid(pid, 0)[1]     # reaped here, never by the loop's reaper
    if status == 0 and data[:1] == b"\1":
        return data[1:]
    kind, _, msg = data[1:].decode(errors="replace").partition("\0")
    msg = msg or f"{op} child exited with status {os.waitstatus_to_exitcode(status)}"
    raise RuntimeFailure(op, container_id, msg, kind == "ContainerNotFound" or _not_found(msg))


def _keep_logging_off_container_stdio() -> None:
    """In the forked child: fds 0-2 are about to become the container's; the runtime's log records and
    tracebacks must keep going to the shim's log instead."""
    import fcntl
    saved = fcntl.fcntl(2, fcntl.F_DUPFD_CLOEXEC, 10)
    stream = open(saved, "w", closefd=False, buffering=1)
    import sys
    sys.stderr = stream
    logging = sys.modules.get("logging")     # only if the runtime uses the stdlib logger
    if logging is not None:
        for h in logging.getLogger().handlers:
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                h.setStream(stream)


IN_PROCESS = ("husk", "inprocess", "in-process")  # the names of the in-process runtime


def make_driver(runtime: str, opts: RuntimeOptions, log_path: str) -> RuntimeDriver:
    """`runtime`: "husk" (in-process), or a runc-compatible binary name or path ("runc", "crun", "/usr/bin/husk")."""
    if runtime in IN_PROCESS:
        return InProcessRuntime(opts)
    return BinaryRuntime(runtime, opts, log_path)


def default_runtime() -> str:
    env = os.environ.get("HUSK_SHIM_RUNTIME")
    if env:
        return env
    try:
        import importlib.util
        if importlib.util.find_spec("runtime.lifecycle") is not None:
            return "husk"
    except ImportError:
        pass
    return "runc"


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env


def _which(name: str) -> str | None:
    for d in os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin").split(":"):
        p = os.path.join(d or ".", name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def _log_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _last_log_error(path: str, offset: int) -> str:
    """The last error message runc-style runtimes wrote to their JSON --log since `offset`."""
    import json
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            if line.strip():
                return line.strip()
            continue
        if rec.get("level") in ("error", "fatal"):
            return str(rec.get("msg", ""))
    return ""
