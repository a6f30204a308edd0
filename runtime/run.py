"""`husk run`: create + start, then (unless detached) wait for the container, forwarding signals and, for a
terminal container without --console-socket, proxying our stdio to the pty.

The runtime process is a subreaper here so the init (and, without a pid namespace, its orphans) are ours to
reap. Returns the container's exit code, 128+signal when it was killed, as runc does.
"""
from __future__ import annotations

import os
import _signal as signal  # the C module: `signal` builds enums on import (~2 ms)

from runtime import lifecycle
from runtime.linux import syscalls as sc

FORWARDED = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGWINCH, signal.SIGCONT)


def run(root: str, container_id: str, bundle: str, *, detach: bool, console_socket: str | None,
        pid_file: str | None, no_pivot: bool, no_new_keyring: bool, preserve_fds: int, keep: bool,
        systemd_cgroup: bool = False) -> int:
    sc.set_child_subreaper(True)
    proxy = None
    if not detach and console_socket is None and _wants_terminal(bundle):
        proxy = _ConsoleProxy()
        console_socket = proxy.path
    try:
        pid = lifecycle.create(root, container_id, bundle, console_socket=console_socket, pid_file=pid_file,
                               no_pivot=no_pivot, no_new_keyring=no_new_keyring, preserve_fds=preserve_fds,
                               systemd_cgroup=systemd_cgroup)
        if proxy is not None:
            proxy.accept()
    except BaseException:
        if proxy is not None:
            proxy.close()
        raise
    if not detach:
        # before start: a signal that arrives as soon as the process runs must reach it, not kill us
        for sig in FORWARDED:
            signal.signal(sig, lambda s, _f: _forward(pid, s))
    try:
        lifecycle.start(root, container_id)
    except BaseException:
        _force_delete(root, container_id)
        if proxy is not None:
            proxy.close()
        raise
    if detach:
        return 0
    try:
        code = proxy.pump(pid) if proxy is not None else _wait(pid)
    finally:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        if proxy is not None:
            proxy.close()
    if not keep:
        _force_delete(root, container_id)
    return code


def _wants_terminal(bundle: str) -> bool:
    """A peek at process.terminal (create validates the config properly right after)."""
    from runtime import jsonload
    try:
        with open(os.path.join(bundle, "config.json"), "rb") as f:
            return bool((jsonload.loads(f.read()).get("process") or {}).get("terminal"))  # type: ignore[union-attr]
    except (OSError, ValueError, AttributeError):
        return False  # create reports the real error


def forward_signals(pid: int) -> None:
    """Relays the signals a foreground runtime receives to `pid` (runc's signal handler does the same)."""
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _f: _forward(pid, s))


def _forward(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait(pid: int) -> int:
    """Reaps children until the init has exited; orphans reparented to us are reaped along the way."""
    while True:
        try:
            wpid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 255
        if wpid == pid:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


def _force_delete(root: str, container_id: str) -> None:
    try:
        lifecycle.delete(root, container_id, force=True)
    except Exception:  # noqa: BLE001 - best effort after the container is gone
        pass


class _ConsoleProxy:
    """Receives the pty master over a private socket and copies between it and our stdin/stdout."""

    def __init__(self) -> None:
        import socket
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="husk-console-")
        self.path = os.path.join(self.dir, "sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(1)
        self.master = -1
        self.saved_tty = None

    def accept(self) -> None:
        import socket
        conn, _ = self.sock.accept()
        try:
            _msg, fds, _flags, _addr = socket.recv_fds(conn, 1024, 1)
        finally:
            conn.close()
        self.master = fds[0]

    def pump(self, pid: int) -> int:
        import select
        import termios
        import tty
        if os.isatty(0):
            self.saved_tty = termios.tcgetattr(0)
            tty.setraw(0)
        pidfd = sc.pidfd_open(pid)
        fds = [pidfd, self.master, 0]
        try:
            while True:
                ready, _, _ = select.select(fds, [], [])
                if self.master in ready:
                    try:
                        data = os.read(self.master, 65536)
                    except OSError:
                        data = b""
                    if data:
                        os.write(1, data)
                    else:
                        fds.remove(self.master)
                if 0 in ready:
                    data = os.read(0, 65536)
                    if data:
                        os.write(self.master, data)
                    else:
                        fds.remove(0)
                if pidfd in ready:
                    break
        finally:
            os.close(pidfd)
            if self.saved_tty is not None:
                termios.tcsetattr(0, termios.TCSADRAIN, self.saved_tty)
        # drain what the process wrote before it exited
        os.set_blocking(self.master, False)
        try:
            while True:
                data = os.read(self.master, 65536)
                if not data:
                    break
                os.write(1, data)
        except OSError:
            pass
        return _wait(pid)

    def close(self) -> None:
        import shutil
        if self.master >= 0:
            os.close(self.master)
            self.master = -1
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


ConsoleProxy = _ConsoleProxy  # used by `husk exec -t` without --console-socket too
