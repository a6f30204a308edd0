"""The long-lived shim process: subreaper, ttrpc server, task service, signal handling, clean exit.

`serve(cfg)` runs in the current process until Shutdown (after Delete); `launch_fresh()` starts it in a
new lean interpreter (`python -I -S`), detached, which is what `start` and `containerd-shim-husk-v2 start`
use. The spawner (shim/spawner.py) calls serve() in a zygote-forked child instead.
"""
from __future__ import annotations

import os
import signal
import socket
import sys

from shim.log import get as get_logger
from shim.loop import Loop
from runtime.linux.proctitle import set_title
from shim.runtime_driver import IN_PROCESS
from shim.service import ShimConfig, TaskService

log = get_logger("husk-shim")

_STATE_FILES_PREFIXES = ("exit", "attach", "runtime-log.json", "init.pid", "exec-", "console-", "runtime.json")


def setup_logging(container_id: str, debug: bool) -> None:
    from shim.log import setup
    setup(container_id, debug)


def serve(cfg: ShimConfig, listener: socket.socket | None = None, ready_fd: int = -1, title: bool = True) -> int:
    """Runs the shim for `cfg` until Shutdown; returns the process exit code. `title`: False for the spawner's
    dry run, which runs in the zygote itself: the zygote must never show as a shim (`pgrep -x husk-shim`)."""
    from runtime.linux import syscalls as sc
    from shim.events import Publisher
    from shim.pb import husk as huskpb, task as taskpb
    from shim.ttrpc_server import Server, Service, listen_unix

    sc.set_child_subreaper(True)
    if title:
        set_title(f"husk-shim {cfg.id}")   # comm "husk-shim" (pgrep -x husk-shim), args "husk-shim <id>"
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    created_state_dir = not os.path.isdir(cfg.state_dir)
    os.makedirs(cfg.state_dir, mode=0o711, exist_ok=True)
    loop = Loop()
    sock = listener if listener is not None else listen_unix(cfg.address)
    publisher = Publisher(loop, cfg.ttrpc_address or None, cfg.namespace)
    svc = TaskService(loop, cfg, publisher, on_shutdown=loop.stop)
    server = Server(loop, sock, [
        Service("containerd.task.v2.Task", taskpb.SERVICES["containerd.task.v2.Task"], svc),
        Service("husk.shim.v1.Shim", huskpb.SERVICES["husk.shim.v1.Shim"], svc),
    ], allowed_uids=cfg.allowed_uids)
    loop.add_signal(signal.SIGCHLD, svc.reap)

    def on_term() -> None:
        if svc.live():
            # The shim is the containers' parent: it does not leave while one lives.
            log.warning("SIGTERM ignored: a container of shim %s is still running", cfg.id)
            return
        loop.stop()

    loop.add_signal(signal.SIGTERM, on_term)
    loop.add_signal(signal.SIGINT, on_term)
    svc.reap()
    if cfg.write_address_file and cfg.bundle:
        _write_atomic(os.path.join(cfg.bundle, "address"), f"unix://{cfg.address}")
    if ready_fd >= 0:
        os.write(ready_fd, f"{os.getpid()}\n".encode())
        os.close(ready_fd)
    log.info("serving on %s (runtime %s, state %s)", cfg.address, cfg.runtime, cfg.state_dir)
    try:
        loop.run()
    finally:
        svc.cleanup()
        server.close()
        try:
            os.unlink(cfg.address)
        except OSError:
            pass
        publisher.flush()
        _remove_state(cfg.state_dir, remove_dir=created_state_dir)
        loop.close()
    log.info("shim exiting")
    return 0


def _remove_state(state_dir: str, remove_dir: bool) -> None:
    try:
        names = os.listdir(state_dir)
    except OSError:
        return
    for name in names:
        if name.startswith(_STATE_FILES_PREFIXES):
            try:
                os.unlink(os.path.join(state_dir, name))
            except OSError:
                pass
    if remove_dir:
        try:
            os.rmdir(state_dir)
        except OSError:
            pass


def _write_atomic(path: str, text: str) -> None:
    from runtime.fsutil import atomic_write  # the file fsync'd, its directory not (the address dies with the boot)
    atomic_write(path, text, sync_dir=False)


# --- starting a detached shim in a fresh interpreter ---------------------------------------------
# argv after -c: path entries joined by os.pathsep, "debug" 0/1, then ShimConfig.to_argv() items.
_BOOT = (
    "import os,sys;sys.path[:0]=sys.argv[1].split(os.pathsep);"
    "from shim.daemon import boot;sys.exit(boot(sys.argv[2:]))"
)


def project_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch_fresh(cfg: ShimConfig, listener: socket.socket, log_fd: int, debug: bool = False) -> int:
    """Starts `serve(cfg)` in a new `python -I -S` process, detached (own session, parent gone).

    The listening socket is inherited as fd 3, stdout/stderr go to `log_fd`. Returns the shim's pid
    once it is serving (it has taken over the socket)."""
    r, wfd = os.pipe2(os.O_CLOEXEC)
    path = [project_root()] + [p for p in sys.path if p and p != project_root()]
    argv = [os.pathsep.join(path), "1" if debug else "0"] + cfg.to_argv()
    pid = os.fork()
    if pid == 0:  # intermediate: new session, fork the shim, exit
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            # Move every source above the targets first: any of them may itself be fd 0-4.
            import fcntl
            srcs = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
                    for fd in (os.open(os.devnull, os.O_RDONLY), log_fd, log_fd, listener.fileno(), wfd)]
            for target, src in enumerate(srcs):
                os.dup2(src, target)
            os.closerange(5, 1 << 16)
            os.chdir(cfg.bundle or "/")
            exe: int | str = sys.executable
            if cfg.runtime in IN_PROCESS:
                # the in-process runtime's stages enter the container: start the shim from the protected
                # interpreter (runtime/exeguard.py) once, rather than re-executing in every create and exec
                from runtime import exeguard
                from runtime.errors import SetupError
                try:
                    exe = exeguard.protected_exe()
                except SetupError as e:  # then each create and exec re-executes protected instead
                    log.warning("shim %s: no protected interpreter: %s", cfg.id, e)
            os.execve(exe, [sys.executable, "-I", "-S", "-c", _BOOT] + argv, os.environ)
        finally:
            os._exit(127)
    os.close(wfd)
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
        raise RuntimeError(f"shim for {cfg.id} exited before serving (see its log)")
    return int(text)


def boot(argv: list[str]) -> int:
    """Entry point inside the fresh interpreter (see _BOOT): fd 3 is the listener, fd 4 the ready pipe."""
    cfg = ShimConfig.from_argv(argv[1:])
    setup_logging(cfg.id, argv[0] == "1")
    os.set_inheritable(3, False)
    os.set_inheritable(4, False)
    return serve(cfg, listener=socket.socket(fileno=3), ready_fd=4)
