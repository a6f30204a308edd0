"""The spawner (zygote): a single-threaded process started by husk-cri before any gRPC thread exists, with
runtime/ and shim/ imported and gc-frozen; it forks every shim (double fork + setsid: shims outlive husk-cri).

It is a fresh interpreter (fork + exec of `python -I -S`, from the protected interpreter when husk-cri runs
from it), not a plain fork of husk-cri: a fork would carry husk-cri's whole heap (click, its config, logging...)
into every shim, where the objects a shim touches lie scattered among them. Measured with 20 pods (shim/README.md,
"memory"): 15.3 MB RSS and 3.5 MB PSS per shim instead of 20.2 MB and 3.9 MB.

Protocol on a SOCK_SEQPACKET socketpair, one JSON object per packet:
  request  {"cfg": {ShimConfig fields}, "log_path": str, "debug": bool}
  response {"pid": int, "address": "unix://..."} or {"error": str}
The zygote exits when husk-cri closes its end. It must never start threads (it forks).
"""
from __future__ import annotations

import gc
import json
import os
import signal
import socket
import sys
import threading

from shim.log import get as get_logger
from shim.record import REQUIRED, Record
from shim.service import ShimConfig

log = get_logger(__name__)
MAX_MSG = 1 << 16
SPAWNER_NAME = "husk-cri-spawner"


class SpawnError(Exception):
    """The zygote could not start a shim; the text says why."""


class Spawned(Record):
    """The shim's pid and its ttrpc address (unix://...)."""
    __slots__ = ("pid", "address")
    FIELDS = (("pid", REQUIRED), ("address", REQUIRED))


class Spawner:
    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self.pid = 0
        self._lock = threading.Lock()

    def start(self, preload: tuple[str, ...] = ()) -> None:
        """Starts the zygote (fork + exec; spawn() waits while it imports). Call before any thread exists in
        this process. `preload`: modules the zygote imports besides RUNTIME_MODULES (SYSTEMD_MODULES when the
        shims' runtime uses the systemd cgroup driver), so that no container start imports them."""
        if threading.active_count() > 1:
            raise SpawnError("Spawner.start() must run before any other thread is started")
        from runtime import exeguard
        from shim.daemon import project_root
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        root = project_root()
        path = os.pathsep.join([root] + [p for p in sys.path if p and p != root])
        argv = exeguard.python_argv() + ["-c", _BOOT, path, ",".join(preload)]
        # the protected interpreter (runtime/exeguard.py) is this process's own executable once husk-cri runs
        # from it: the zygote and every shim then inherit it; otherwise they re-execute per container as before
        exe = "/proc/self/exe" if exeguard.is_protected() else sys.executable
        pid = os.fork()
        if pid == 0:
            try:
                import fcntl
                os.dup2(fcntl.fcntl(child.fileno(), fcntl.F_DUPFD_CLOEXEC, 10), 3)   # the channel is fd 3
                os.closerange(4, 1 << 16)
                os.execve(exe, argv, os.environ)
            except BaseException:  # the zygote reports, then leaves without running the parent's handlers
                log.exception("spawner zygote: cannot execute %s", exe)
            finally:
                os._exit(127)
        child.close()
        self._sock = parent
        self.pid = pid

    def spawn(self, cfg: ShimConfig, log_path: str = "", debug: bool = False, timeout: float = 30.0) -> Spawned:
        if self._sock is None:
            raise SpawnError("spawner not started")
        d = cfg.as_dict()
        if d["allowed_uids"] is not None:
            d["allowed_uids"] = list(d["allowed_uids"])
        req = json.dumps({"cfg": d, "log_path": log_path, "debug": debug}).encode()
        with self._lock:
            self._sock.settimeout(timeout)
            try:
                self._sock.send(req)
                data = self._sock.recv(MAX_MSG)
            except OSError as err:
                raise SpawnError(f"spawner: {err}") from err
        if not data:
            raise SpawnError("spawner exited")
        resp = json.loads(data)
        if "error" in resp:
            raise SpawnError(resp["error"])
        return Spawned(int(resp["pid"]), resp["address"])

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self.pid:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = 0


# The zygote's program: sys.path from argv (-I -S leave none to speak of), the channel is fd 3.
_BOOT = ("import os,socket,sys;sys.path[:0]=sys.argv[1].split(os.pathsep);"
         "from shim.spawner import _zygote_main;"
         "os._exit(_zygote_main(socket.socket(fileno=3),tuple(filter(None,sys.argv[2].split(',')))))")

# What the in-process runtime imports lazily while it creates a container: loaded once in the zygote so that
# the shims share them instead of importing them in every container start, and because the container's init
# imports some after pivot_root, where the host's Python library directory is out of reach ("No module named
# '_sha256'" for a seccomp profile).
RUNTIME_MODULES = ("runtime.lifecycle", "runtime.parent", "runtime.child", "runtime.init", "runtime.sync",
                   "runtime.state", "runtime.config", "runtime.jsonload", "runtime.capabilities",
                   "runtime.process", "runtime.rootfs", "runtime.hooks", "runtime.network", "runtime.console",
                   "runtime.cgroups.v1", "runtime.cgroups.v2", "runtime.seccomp", "runtime.seccomp_lib",
                   "runtime.seccomp_notify", "runtime.schema.validator", "runtime.execute", "runtime.execflags",
                   "runtime.exeguard", "runtime.update", "resource", "_sha256", "_sha2", "hashlib")
# The systemd cgroup driver's (its D-Bus client imports jeepney: ~28 ms per container start if not preloaded).
SYSTEMD_MODULES = ("runtime.cgroups.systemd", "runtime.cgroups.systemd_dbus", "jeepney.io.common",
                   "jeepney.bus")


def _preload(extra: tuple[str, ...] = ()) -> None:
    """Everything a shim needs, imported once in the zygote so every forked shim shares the pages."""
    import importlib
    import runtime.linux.syscalls  # noqa: F401
    import shim.cgroup_watch  # noqa: F401
    import shim.client  # noqa: F401
    import shim.daemon  # noqa: F401
    import shim.events  # noqa: F401
    import shim.pb.cgroups_v1  # noqa: F401
    import shim.rootfs  # noqa: F401
    import shim.runtime_driver  # noqa: F401
    import shim.ttrpc_server  # noqa: F401
    for name in RUNTIME_MODULES + extra:
        try:
            importlib.import_module(name)
        except (ImportError, OSError):
            pass


def _zygote_main(chan: socket.socket, preload: tuple[str, ...] = ()) -> int:
    from shim.proctitle import set_title
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # comm "husk-cri-spawne" (15 bytes): neither `pgrep -x husk-cri` (the daemon) nor `pgrep husk-shim` match it
    set_title(SPAWNER_NAME)
    # Keep only stdio and the channel: the zygote must not hold husk-cri's sockets or files open.
    keep = chan.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)
    _preload(preload)
    gc.collect()
    gc.freeze()
    while True:
        try:
            data = chan.recv(MAX_MSG)
        except InterruptedError:
            continue
        except ConnectionResetError:
            data = b""
        if not data:
            return 0  # husk-cri closed its end (stopped, or died): the zygote's work is over
        try:
            resp = _spawn_one(json.loads(data), chan)
        except Exception as err:  # every failure is an answer, never the zygote's end
            resp = {"error": f"{type(err).__name__}: {err}"}
        try:
            chan.send(json.dumps(resp).encode())
        except (BrokenPipeError, ConnectionResetError):
            # husk-cri went away mid-spawn (killed, or stopped while a container was being created): one line,
            # no traceback. The shim started for it (if any) keeps running, as every shim outlives husk-cri.
            log.warning("spawner: husk-cri went away before the answer %s; exiting", _brief(resp))
            return 0


def _brief(resp: dict) -> str:
    if "pid" in resp:
        return f"(shim pid {resp['pid']} at {resp.get('address', '')})"
    return f"(error: {resp.get('error', '')})"


def _spawn_one(req: dict, chan: socket.socket) -> dict:
    from shim.daemon import serve, setup_logging
    from shim.ttrpc_server import listen_unix
    c = dict(req["cfg"])
    if c.get("allowed_uids") is not None:
        c["allowed_uids"] = tuple(c["allowed_uids"])
    cfg = ShimConfig(**c)
    os.makedirs(cfg.state_dir, mode=0o711, exist_ok=True)
    os.makedirs(os.path.dirname(cfg.address) or ".", mode=0o711, exist_ok=True)
    log_path = req.get("log_path") or os.path.join(cfg.state_dir, "shim.log")
    listener = listen_unix(cfg.address)   # bound here: errors are reported synchronously
    r, w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            chan.close()
            os.close(r)
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            # Only stdio, the listener (3) and the ready pipe (4) survive: nothing of husk-cri's leaks.
            import fcntl
            lfd = listener.detach()     # the socket object must not close fd 3 when it is dropped
            srcs = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (
                os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC),
                os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640),
                lfd, w)]
            for target, src in zip((0, 1, 3, 4), srcs):
                os.dup2(src, target, inheritable=False)
            os.dup2(1, 2, inheritable=False)
            os.closerange(5, 1 << 16)
            listener = socket.socket(fileno=3)
            os.chdir(cfg.bundle or "/")
            setup_logging(cfg.id, bool(req.get("debug")))
            code = serve(cfg, listener=listener, ready_fd=4)
        except BaseException:
            get_logger("husk-shim").exception("shim failed")
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    listener.close()
    os.waitpid(pid, 0)
    data = b""
    while True:
        b = os.read(r, 64)
        if not b:
            break
        data += b
    os.close(r)
    text = data.strip()
    if not text.isdigit():
        try:
            os.unlink(cfg.address)
        except OSError:
            pass
        raise SpawnError(f"shim for {cfg.id} exited before serving (log: {log_path})")
    return {"pid": int(text), "address": f"unix://{cfg.address}"}
