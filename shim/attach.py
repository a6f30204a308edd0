"""The attach channel: a SOCK_SEQPACKET unix socket per process through which clients reach its live stdio.

Protocol (every packet is one message: 1 kind byte, then the payload):
  client -> shim   0x00 STDIN <bytes>        written to the process's stdin (if it has one)
                   0x01 RESIZE >HH width,height   (terminal processes)
                   0x02 CLOSE_STDIN          closes the process's stdin
  shim -> client   0x01 STDOUT <bytes>, 0x02 STDERR <bytes>   every chunk, to every attached client
                   0x03 EXIT >I exit status  after the output the process wrote before exiting; then close
A client that falls more than MAX_QUEUED bytes behind is disconnected (the log and fifos never wait for it),
unless the process's output waits for its attached clients (exec processes, see ProcessIO): then the shim
stops reading the process's output while a client is HIGH_WATER bytes behind, and on_drained resumes it.
While the process's stdin buffer is full the shim reads no client packets (pause_input/resume_input).

The clients (the only ones in the tree) are here too: `AttachClient` (blocking: tests, simple callers) and
`AsyncAttachClient` (asyncio: husk-cri's streaming and ExecSync); both build and read packets with the
same functions (stdin_packets, resize_packet, exit_status) and connect with `connect`.
"""
from __future__ import annotations

# typing costs ~1.7 MB per process; it is needed by type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

import os
import socket
import struct
from collections import deque

from shim.loop import Loop
from shim.unixpath import bind_unix
from shim.log import get as get_logger

log = get_logger(__name__)

STDIN, RESIZE, CLOSE_STDIN = 0x00, 0x01, 0x02
STDOUT, STDERR, EXIT = 0x01, 0x02, 0x03
MAX_PACKET = 64 * 1024 + 1
MAX_QUEUED = 4 << 20
HIGH_WATER = 1 << 20
_SIZE = struct.Struct(">HH")


class AttachServer:
    def __init__(self, loop: Loop, path: str, on_stdin: Callable[[bytes], None],
                 on_resize: Callable[[int, int], None], on_close_stdin: Callable[[], None],
                 on_detach: Callable[[], None] | None = None,
                 on_drained: Callable[[], None] | None = None) -> None:
        self.loop = loop
        self.path = path
        self.on_stdin = on_stdin
        self.on_resize = on_resize
        self.on_close_stdin = on_close_stdin
        self.on_detach = on_detach
        self.on_drained = on_drained
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        bind_unix(self.sock, path)
        self.sock.listen(16)
        self.clients: dict[int, _Client] = {}
        self.exit_status: int | None = None
        self.input_paused = False   # the process's stdin buffer is full: clients' packets wait in their sockets
        loop.add_reader(self.sock.fileno(), self._accept)

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                log.warning("attach %s: accept: %s", self.path, err)
                return
            c.setblocking(False)
            client = _Client(self, c)
            self.clients[client.fd] = client
            if self.exit_status is not None:
                client.send(bytes([EXIT]) + struct.pack(">I", self.exit_status))
                client.close_after_flush()

    def pause_input(self) -> None:
        """Stop reading clients' packets (their senders block once the socket buffers are full)."""
        if not self.input_paused:
            self.input_paused = True
            for client in self.clients.values():
                self.loop.remove_reader(client.fd)

    def resume_input(self) -> None:
        if self.input_paused:
            self.input_paused = False
            for client in list(self.clients.values()):
                self.loop.add_reader(client.fd, client._on_read)

    def backlog(self) -> int:
        """Bytes queued for the slowest attached client."""
        return max((c.queued for c in self.clients.values()), default=0)

    def _drained(self) -> None:
        if self.on_drained is not None:
            self.on_drained()

    def broadcast(self, kind: int, data: bytes) -> None:
        if not self.clients:
            return
        for start in range(0, len(data), MAX_PACKET - 1):
            pkt = bytes([kind]) + data[start:start + MAX_PACKET - 1]
            for client in list(self.clients.values()):
                client.send(pkt)

    def exited(self, status: int) -> None:
        """The process exited and its output written so far was broadcast: tell every client, then close."""
        self.exit_status = status
        pkt = bytes([EXIT]) + struct.pack(">I", status)
        for client in list(self.clients.values()):
            client.send(pkt)
            client.close_after_flush()

    def close(self) -> None:
        for client in list(self.clients.values()):
            client.close()
        try:
            self.loop.remove(self.sock.fileno())
        except (KeyError, ValueError):
            pass
        self.sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class _Client:
    def __init__(self, server: AttachServer, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.fd = sock.fileno()
        self.queue: deque[bytes] = deque()
        self.queued = 0
        self.closing = False
        self.closed = False
        if not server.input_paused:
            server.loop.add_reader(self.fd, self._on_read)

    def _on_read(self) -> None:
        try:
            pkt = self.sock.recv(MAX_PACKET)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if not pkt:
            self.close()
            return
        kind, body = pkt[0], pkt[1:]
        if kind == STDIN:
            self.server.on_stdin(body)
        elif kind == RESIZE and len(body) == _SIZE.size:
            w, h = _SIZE.unpack(body)
            self.server.on_resize(w, h)
        elif kind == CLOSE_STDIN:
            self.server.on_close_stdin()
        else:
            log.debug("attach %s: ignoring packet kind %d", self.server.path, kind)

    def send(self, pkt: bytes) -> None:
        if self.closed:
            return
        if self.queued + len(pkt) > MAX_QUEUED:
            log.warning("attach %s: client too slow; disconnecting it", self.server.path)
            self.close()
            return
        self.queue.append(pkt)
        self.queued += len(pkt)
        self._flush()

    def _flush(self) -> None:
        while self.queue:
            pkt = self.queue[0]
            try:
                self.sock.send(pkt)
            except (BlockingIOError, InterruptedError):
                self.server.loop.add_writer(self.fd, self._flush)
                return
            except OSError:
                self.close()
                return
            self.queue.popleft()
            self.queued -= len(pkt)
        if self.closed:
            return
        self.server.loop.remove_writer(self.fd)
        if self.closing:
            self.close()
        else:
            self.server._drained()

    def close_after_flush(self) -> None:
        self.closing = True
        if not self.queue:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.server.loop.remove(self.fd)
        self.sock.close()
        self.server.clients.pop(self.fd, None)
        if self.server.on_detach is not None:
            self.server.on_detach()
        self.server._drained()      # its backlog is gone: output held back for it may flow again


# --- clients ------------------------------------------------------------------------------------------------
CLOSE_STDIN_PACKET = bytes([CLOSE_STDIN])


def stdin_packets(data: bytes) -> list[bytes]:
    """`data` as STDIN packets of at most MAX_PACKET bytes each."""
    step = MAX_PACKET - 1
    return [bytes([STDIN]) + data[start:start + step] for start in range(0, len(data), step)]


def resize_packet(width: int, height: int) -> bytes:
    return bytes([RESIZE]) + _SIZE.pack(width, height)


def exit_status(body: bytes) -> int | None:
    """The status of an EXIT packet's body (None if malformed)."""
    return struct.unpack(">I", body)[0] if len(body) == 4 else None


def connect(path: str, timeout: float | None) -> socket.socket:
    """A connected SOCK_SEQPACKET socket to the attach socket at `path` (paths over 107 bytes go through
    /proc/self/fd). A unix connect completes at once or fails; the timeout only guards a full backlog."""
    from shim.unixpath import connect_unix
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        connect_unix(sock, path)
    except BaseException:
        sock.close()
        raise
    return sock


class AttachClient:
    """Blocking client for tests and simple callers: send stdin, resize, read (kind, data) messages."""

    def __init__(self, path: str, timeout: float | None = 10.0) -> None:
        self.sock = connect(path, timeout)

    def write_stdin(self, data: bytes) -> None:
        for pkt in stdin_packets(data):
            self.sock.send(pkt)

    def resize(self, width: int, height: int) -> None:
        self.sock.send(resize_packet(width, height))

    def close_stdin(self) -> None:
        self.sock.send(CLOSE_STDIN_PACKET)

    def read(self) -> tuple[int, bytes] | None:
        pkt = self.sock.recv(MAX_PACKET)
        if not pkt:
            return None
        return pkt[0], pkt[1:]

    def read_all(self) -> tuple[bytes, bytes, int | None]:
        """Reads until the shim closes: (stdout, stderr, exit status or None)."""
        out, err, status = bytearray(), bytearray(), None
        while True:
            msg = self.read()
            if msg is None:
                return bytes(out), bytes(err), status
            kind, body = msg
            if kind == STDOUT:
                out += body
            elif kind == STDERR:
                err += body
            elif kind == EXIT:
                status = exit_status(body)

    def close(self) -> None:
        self.sock.close()


class AsyncAttachClient:
    """The same channel on asyncio (husk-cri's loop): recv() yields (kind, payload) until the shim closes the
    connection (after EXIT, or when it drops the client); the send side carries stdin, its close and
    terminal sizes. asyncio is imported only by its users."""

    def __init__(self, sock: socket.socket, path: str) -> None:
        import asyncio
        self._sock = sock
        self.path = path
        self._loop = asyncio.get_running_loop()
        self.closed = False

    @classmethod
    async def connect(cls, path: str, timeout: float = 5.0) -> "AsyncAttachClient":
        sock = connect(path, timeout)
        try:
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return cls(sock, path)

    async def recv(self) -> tuple[int, bytes] | None:
        if self.closed:
            return None
        try:
            pkt = await self._loop.sock_recv(self._sock, MAX_PACKET)
        except (ConnectionResetError, BrokenPipeError):
            return None
        if not pkt:
            return None
        return pkt[0], pkt[1:]

    async def write_stdin(self, data: bytes) -> None:
        for pkt in stdin_packets(data):
            await self._loop.sock_sendall(self._sock, pkt)

    async def close_stdin(self) -> None:
        await self._loop.sock_sendall(self._sock, CLOSE_STDIN_PACKET)

    async def resize(self, width: int, height: int) -> None:
        await self._loop.sock_sendall(self._sock, resize_packet(width, height))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._sock.close()
