"""A process's stdio as the shim holds it: pipes or a pty to the container, copied to and from the fifos
or files containerd names, the CRI log file and attached clients.

Stdio URIs: "" (none: /dev/null), "/path" or "fifo:///path" (a fifo; opened read-write so the shim never
sees EPIPE/EOF while its reader is away), "file:///path" (appended), "attach:" (a pipe reached only through
the attach socket). Never blocks the loop: fifo writers that cannot keep up pause reading from the container
(like containerd's shim); attached clients that cannot keep up are dropped, except with attach_backpressure
(exec processes, whose attached client is their only reader), where they pause reading from the process too.
"""
from __future__ import annotations

# typing costs ~1.7 MB per process; it is needed by type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

import errno
import fcntl
import os
import socket
import stat
import struct
import termios

from shim import attach as att
from shim.crilog import CriLogWriter
from shim.loop import Loop
from shim.record import REQUIRED, Record
from shim.log import get as get_logger

log = get_logger(__name__)

READ_CHUNK = 64 * 1024
MAX_SINK_BUFFER = 1 << 20
MAX_STDIN_BUFFER = 1 << 20


class ChildStdio(Record):
    """What the runtime hands to the container: three fds (or /dev/null) and, for a tty, a console socket."""
    __slots__ = ("stdin", "stdout", "stderr", "console_socket")
    FIELDS = (("stdin", REQUIRED), ("stdout", REQUIRED), ("stderr", REQUIRED), ("console_socket", None))


def _parse_uri(uri: str) -> tuple[str, str]:
    if not uri:
        return "none", ""
    if uri == "attach:" or uri.startswith("attach:"):
        return "attach", ""
    if uri.startswith("fifo://"):
        return "fifo", uri[len("fifo://"):]
    if uri.startswith("file://"):
        return "file", uri[len("file://"):]
    if uri.startswith("/"):
        return "fifo", uri
    raise ValueError(f"unsupported stdio URI {uri!r} (want a path, fifo://, file:// or attach:)")


class _Sink:
    """An output destination for one stream: a fifo or a file, written without blocking the loop."""

    def __init__(self, io: "ProcessIO", kind: str, path: str) -> None:
        self.io = io
        self.path = path
        self.buf = bytearray()
        self.finishing = False
        if kind == "file":
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
            self.blocking_ok = True
        else:
            st = os.stat(path)
            if not stat.S_ISFIFO(st.st_mode):
                # containerd always passes fifos; a regular file path is appended to like file://.
                self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                self.blocking_ok = True
            else:
                self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
                self.blocking_ok = False

    @property
    def full(self) -> bool:
        return len(self.buf) >= MAX_SINK_BUFFER

    def write(self, data: bytes) -> None:
        if self.buf:
            self.buf += data
            return
        try:
            n = os.write(self.fd, data)
        except BlockingIOError:
            n = 0
        except OSError as err:
            log.warning("%s: stdio %s: write: %s", self.io.label, self.path, err)
            return
        if n < len(data):
            self.buf += data[n:]
            self.io.loop.add_writer(self.fd, self._flush)

    def _flush(self) -> None:
        while self.buf:
            try:
                n = os.write(self.fd, self.buf)
            except BlockingIOError:
                return
            except OSError as err:
                log.warning("%s: stdio %s: write: %s", self.io.label, self.path, err)
                self.buf.clear()
                break
            del self.buf[:n]
        self.io.loop.remove_writer(self.fd)
        if self.finishing:
            self.close()
            return
        self.io.resume_reading()

    def finish(self) -> None:
        """End of the stream: close once everything buffered reached the reader (which sees EOF after it)."""
        if self.buf:
            self.finishing = True
            self.io._finishing.append(self)
        else:
            self.close()

    def close(self) -> None:
        """Closes now; bytes the reader never took are dropped (only when the process is deleted)."""
        if self.fd < 0:
            return
        if self.buf:
            log.warning("%s: stdio %s: %d bytes undelivered", self.io.label, self.path, len(self.buf))
            self.buf.clear()
        self.io.loop.remove(self.fd)
        os.close(self.fd)
        self.fd = -1


class ProcessIO:
    """The stdio of one container process (init or exec)."""

    def __init__(self, loop: Loop, label: str, *, stdin: str, stdout: str, stderr: str, terminal: bool,
                 crilog: CriLogWriter | None = None, attach_path: str | None = None,
                 console_dir: str | None = None, stdin_once: bool = False,
                 attach_backpressure: bool = False) -> None:
        self.loop = loop
        self.label = label
        self.terminal = terminal
        self.crilog = crilog
        self.stdin_once = stdin_once
        # An exec's output has no log: its attached client (kubectl exec, ExecSync) is the one reader that
        # matters, so a slow client holds the process back instead of losing output.
        self.attach_backpressure = attach_backpressure
        self.uris = (stdin, stdout, stderr)
        self._child_fds: list[int] = []
        self._stdin_w = -1              # where the shim writes the container's stdin (pipe or pty master)
        self._stdin_buf = bytearray()
        self._stdin_closing = False
        self._out: dict[str, int] = {}  # stream -> fd the shim reads
        self._sinks: dict[str, list[_Sink]] = {"stdout": [], "stderr": []}
        self._finishing: list[_Sink] = []  # ended streams whose fifo still has buffered output
        self._stdin_source = -1         # the stdin fifo the shim reads
        self._paused = False
        self._console_sock: socket.socket | None = None
        self._master = -1
        self.attach: att.AttachServer | None = None
        self._closed = False
        self.on_all_closed: Callable[[], None] | None = None
        self.child = self._prepare(console_dir)
        if attach_path:
            self.attach = att.AttachServer(loop, attach_path, self.write_stdin, self.resize,
                                           self.close_stdin, self._on_detach,
                                           self.resume_reading if attach_backpressure else None)
        self._attached_once = False

    # --- setup ---------------------------------------------------------------------------
    def _prepare(self, console_dir: str | None) -> ChildStdio:
        stdin_kind, stdin_path = _parse_uri(self.uris[0])
        out_kinds = [_parse_uri(u) for u in self.uris[1:]]
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        self._child_fds.append(devnull)
        try:
            for stream, (kind, path) in zip(("stdout", "stderr"), out_kinds):
                if kind in ("fifo", "file"):
                    self._sinks[stream].append(_Sink(self, kind, path))
            if stdin_kind == "fifo":
                self._stdin_source = os.open(stdin_path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            if self.terminal:
                tmp = os.environ.get("TMPDIR", "/tmp")
                path = os.path.join(console_dir or tmp, f"console-{os.getpid()}-{id(self):x}.sock")
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
                if len(path) > 100:
                    d = os.path.join(tmp, f"husk-shim-{os.getpid()}-{id(self):x}")
                    os.mkdir(d, 0o700)
                    path = os.path.join(d, "console.sock")
                sock.bind(path)
                sock.listen(1)
                self._console_sock = sock
                return ChildStdio(devnull, devnull, devnull, console_socket=path)
            fds = [devnull, devnull, devnull]
            if stdin_kind != "none":
                r, w = os.pipe2(os.O_CLOEXEC)
                self._child_fds.append(r)
                self._stdin_w = w
                os.set_blocking(w, False)
                fds[0] = r
            for i, stream in ((1, "stdout"), (2, "stderr")):
                if out_kinds[i - 1][0] != "none" or self.crilog is not None:
                    r, w = os.pipe2(os.O_CLOEXEC)
                    self._child_fds.append(w)
                    self._out[stream] = r
                    os.set_blocking(r, False)
                    fds[i] = w
            return ChildStdio(fds[0], fds[1], fds[2])
        except BaseException:
            self.close()
            raise

    def started(self) -> None:
        """The runtime returned: drop the container's ends and begin copying."""
        for fd in self._child_fds:
            os.close(fd)
        self._child_fds = []
        if self._console_sock is not None:
            self._receive_console()
        if self._stdin_source >= 0:
            self.loop.add_reader(self._stdin_source, self._on_stdin_source)
        for stream, fd in self._out.items():
            self.loop.add_reader(fd, lambda s=stream: self._on_output(s))

    def abandon(self) -> None:
        """The runtime failed: close everything without waiting for output."""
        self.close()

    def _receive_console(self) -> None:
        assert self._console_sock is not None
        sock, path = self._console_sock, self._console_sock.getsockname()
        sock.settimeout(5)
        try:
            conn, _ = sock.accept()
            with conn:
                conn.settimeout(5)
                _msg, fds, _flags, _addr = socket.recv_fds(conn, 4096, 1)
        finally:
            sock.close()
            self._console_sock = None
            try:
                os.unlink(path)
                if os.path.basename(os.path.dirname(path)).startswith("husk-shim-"):
                    os.rmdir(os.path.dirname(path))
            except OSError:
                pass
        if not fds:
            raise OSError(errno.EPROTO, f"{self.label}: runtime sent no console fd")
        self._master = fds[0]
        os.set_inheritable(self._master, False)
        os.set_blocking(self._master, False)
        self._stdin_w = self._master
        self._out["stdout"] = self._master

    # --- output --------------------------------------------------------------------------
    def _on_output(self, stream: str) -> None:
        if self._paused:
            return
        fd = self._out.get(stream)
        if fd is None:
            return
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError as err:
            if err.errno != errno.EIO:      # EIO: the pty's last slave closed
                log.warning("%s: read %s: %s", self.label, stream, err)
            data = b""
        if not data:
            self._end_stream(stream)
            return
        self._deliver(stream, data)

    def _deliver(self, stream: str, data: bytes) -> None:
        if self.crilog is not None:
            self.crilog.write(stream, data)
        for sink in self._sinks[stream]:
            sink.write(data)
        if self.attach is not None:
            self.attach.broadcast(att.STDOUT if stream == "stdout" else att.STDERR, data)
        if any(s.full for sinks in self._sinks.values() for s in sinks) or self._attach_behind():
            self._pause()

    def _attach_behind(self) -> bool:
        return self.attach_backpressure and self.attach is not None and self.attach.backlog() >= att.HIGH_WATER

    def _pause(self) -> None:
        self._paused = True
        for fd in set(self._out.values()):
            self.loop.remove_reader(fd)

    def resume_reading(self) -> None:
        if not self._paused or any(s.full for sinks in self._sinks.values() for s in sinks) \
                or self._attach_behind():
            return
        self._paused = False
        for stream, fd in self._out.items():
            self.loop.add_reader(fd, lambda s=stream: self._on_output(s))

    def drain(self) -> None:
        """Reads everything already written to the output pipes (the process just exited)."""
        for stream in list(self._out):
            for _ in range(64):         # bounded: a live grandchild may keep writing
                fd = self._out.get(stream)
                if fd is None:
                    break
                try:
                    data = os.read(fd, READ_CHUNK)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:
                    self._end_stream(stream)
                    break
                self._deliver(stream, data)

    def _end_stream(self, stream: str) -> None:
        fd = self._out.pop(stream, None)
        if fd is None:
            return
        if self.crilog is not None:
            self.crilog.flush_partial(stream)
        if fd not in self._out.values():
            self.loop.remove(fd)
            if fd != self._master:
                os.close(fd)
        for sink in self._sinks[stream]:
            sink.finish()
        self._sinks[stream] = []
        if not self._out and self.on_all_closed is not None:
            self.on_all_closed()

    @property
    def output_open(self) -> bool:
        return bool(self._out)

    # --- stdin ---------------------------------------------------------------------------
    def _on_stdin_source(self) -> None:
        if len(self._stdin_buf) >= MAX_STDIN_BUFFER:
            self.loop.remove_reader(self._stdin_source)
            return
        try:
            data = os.read(self._stdin_source, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.write_stdin(data)

    def write_stdin(self, data: bytes) -> None:
        if self._stdin_w < 0 or self._stdin_closing:
            return
        self._stdin_buf += data
        self._flush_stdin()
        if len(self._stdin_buf) >= MAX_STDIN_BUFFER and self.attach is not None:
            # The process is not reading its stdin: hold attached clients back instead of buffering
            # without bound (their packets wait in the sockets; kubectl feels back-pressure).
            self.attach.pause_input()

    def _flush_stdin(self) -> None:
        while self._stdin_buf and self._stdin_w >= 0:
            try:
                n = os.write(self._stdin_w, self._stdin_buf)
            except BlockingIOError:
                self.loop.add_writer(self._stdin_w, self._flush_stdin)
                return
            except OSError:
                self._stdin_buf.clear()
                break
            del self._stdin_buf[:n]
        if self._stdin_w >= 0:
            self.loop.remove_writer(self._stdin_w)
        if self._stdin_source >= 0 and len(self._stdin_buf) < MAX_STDIN_BUFFER:
            self.loop.add_reader(self._stdin_source, self._on_stdin_source)
        if self.attach is not None and len(self._stdin_buf) < MAX_STDIN_BUFFER:
            self.attach.resume_input()
        if self._stdin_closing:
            self._really_close_stdin()

    def close_stdin(self) -> None:
        """CloseIO(stdin): the container reads EOF once what was written before is delivered."""
        if self._stdin_source >= 0:
            self.loop.remove(self._stdin_source)
            os.close(self._stdin_source)
            self._stdin_source = -1
        self._stdin_closing = True
        if not self._stdin_buf:
            self._really_close_stdin()

    def _really_close_stdin(self) -> None:
        if self._stdin_w < 0:
            return
        if self._stdin_w == self._master:
            # A tty has no half-close: send EOF (^D) as a terminal would.
            try:
                os.write(self._master, b"\x04")
            except OSError:
                pass
        else:
            self.loop.remove(self._stdin_w)
            os.close(self._stdin_w)
        self._stdin_w = -1

    def _on_detach(self) -> None:
        if self.stdin_once and not self._attached_once:
            self._attached_once = True
            self.close_stdin()

    # --- tty -----------------------------------------------------------------------------
    def resize(self, width: int, height: int) -> None:
        if self._master < 0:
            raise OSError(errno.ENOTTY, f"{self.label}: process has no terminal")
        fcntl.ioctl(self._master, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))

    # --- end -----------------------------------------------------------------------------
    def exited(self, status: int) -> None:
        """Called after drain(): attached clients get the exit status after the output."""
        if self.attach is not None:
            self.attach.exited(status)

    def reopen_log(self) -> None:
        if self.crilog is not None:
            self.crilog.reopen()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fd in self._child_fds:
            os.close(fd)
        self._child_fds = []
        for stream in list(self._out):
            self._end_stream(stream)
        for sinks in self._sinks.values():
            for s in sinks:
                s.close()
        for s in self._finishing:
            s.close()
        self._finishing = []
        if self._stdin_source >= 0:
            self.loop.remove(self._stdin_source)
            os.close(self._stdin_source)
            self._stdin_source = -1
        if self._stdin_w >= 0 and self._stdin_w != self._master:
            self.loop.remove(self._stdin_w)
            os.close(self._stdin_w)
        self._stdin_w = -1
        if self._master >= 0:
            self.loop.remove(self._master)
            os.close(self._master)
            self._master = -1
        if self._console_sock is not None:
            path = self._console_sock.getsockname()
            self._console_sock.close()
            self._console_sock = None
            try:
                os.unlink(path)
                if os.path.basename(os.path.dirname(path)).startswith("husk-shim-"):
                    os.rmdir(os.path.dirname(path))
            except OSError:
                pass
        if self.attach is not None:
            self.attach.close()
            self.attach = None
