"""The interface between the streaming server and whatever runs processes: StreamBackend and StreamIO.

Owns the contract husk-cri implements (over the shim's ttrpc Exec and attach socket) and the small
I/O objects handed to it. Must not contain protocol code: the transports adapt to these objects.
"""
from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from .requests import AttachRequest, ExecRequest, PortForwardRequest


@dataclass(frozen=True)
class TerminalSize:
    """A TTY size as kubectl sends it ({"Width": w, "Height": h}, both uint16)."""

    width: int
    height: int


class TargetNotFound(LookupError):
    """The container or sandbox named by a streaming request does not exist (HTTP 404 before upgrade)."""

    def __init__(self, kind: str, target_id: str) -> None:
        super().__init__(f"{kind} {target_id!r} not found")
        self.kind = kind
        self.target_id = target_id


class TargetNotRunning(RuntimeError):
    """The container exists but is not running (HTTP 409 before upgrade)."""

    def __init__(self, kind: str, target_id: str, state: str = "not running") -> None:
        super().__init__(f"{kind} {target_id!r} is {state}")
        self.kind = kind
        self.target_id = target_id


class InputStream(Protocol):
    """What the client sends on stdin."""

    async def read(self, n: int = 65536) -> bytes:
        """Up to n bytes as soon as some are there; b"" at end of input.

        End of input comes when the client closes stdin (SPDY FIN, WebSocket v5 CLOSE on channel 0)
        or when the client goes away. Then the backend should close the process's stdin."""


class OutputStream(Protocol):
    """Where the backend writes the process's stdout or stderr for the client."""

    async def write(self, data: bytes) -> None:
        """Send data; waits while the client is slower than the process (back-pressure).

        Never raises because the client left: after a disconnect data is discarded (StreamIO.client_gone
        is set), so a pump copying a process's output keeps draining it and the process is not blocked."""

    async def close(self) -> None:
        """End of this output for the client. Optional: the server closes all outputs after the call."""


class ResizeQueue:
    """TTY size changes from the client, oldest first; get() returns None once no more can come.

    Holds at most `maxlen` pending sizes; when the backend does not keep up the oldest are dropped,
    since only the latest size matters."""

    def __init__(self, maxlen: int = 16) -> None:
        self._items: deque[TerminalSize] = deque(maxlen=maxlen)
        self._closed = False
        self._event = asyncio.Event()

    def put(self, size: TerminalSize) -> None:
        if not self._closed:
            self._items.append(size)
            self._event.set()

    def close(self) -> None:
        self._closed = True
        self._event.set()

    async def get(self) -> TerminalSize | None:
        while not self._items:
            if self._closed:
                return None
            self._event.clear()
            await self._event.wait()
        return self._items.popleft()

    def __aiter__(self) -> ResizeQueue:
        return self

    async def __anext__(self) -> TerminalSize:
        size = await self.get()
        if size is None:
            raise StopAsyncIteration
        return size


@dataclass(eq=False)
class StreamIO:
    """The client's side of one exec or attach session, as the backend sees it.

    stdin/stdout/stderr are None when the request did not ask for them (stderr is always None with a
    TTY: a terminal has one output). resize is set only for TTY sessions whose protocol carries sizes
    (SPDY v3+ and every WebSocket protocol). client_gone is set when the connection to the client
    ended: an attach backend should then detach and return; an exec backend keeps draining output
    until the process exits, as kubelet does (the process sees stdin EOF, it is not killed)."""

    tty: bool
    stdin: InputStream | None
    stdout: OutputStream | None
    stderr: OutputStream | None
    resize: ResizeQueue | None
    client_gone: asyncio.Event = field(default_factory=asyncio.Event)


@runtime_checkable
class StreamBackend(Protocol):
    """What the streaming server needs from husk-cri. All methods run on the server's event loop.

    Errors: raise TargetNotFound when the container/sandbox does not exist; any other exception from
    exec/attach becomes an InternalError Status on the error stream; from port_forward, an error
    message on the port's error stream. Cancellation (server stop) arrives as CancelledError: clean up
    (an exec backend should kill the process it started) and re-raise."""

    async def check(self, request: ExecRequest | AttachRequest | PortForwardRequest) -> None:
        """Called before the connection is upgraded: raise TargetNotFound for an unknown container or
        sandbox, so the client gets a plain 404 instead of an upgraded session that fails at once;
        TargetNotRunning (409) for a container that is not running."""

    async def exec(self, container_id: str, cmd: list[str], io: StreamIO) -> int:
        """Run cmd in the container with io as its stdio; return its exit code (128+n for signal n)."""

    async def attach(self, container_id: str, io: StreamIO) -> None:
        """Connect io to the container's live stdio (the shim's attach channel) until the container's
        output ends or io.client_gone is set. Must not stop the container."""

    async def port_forward(self, sandbox_id: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection to 127.0.0.1:port inside the sandbox's network namespace. Raise OSError
        (e.g. ConnectionRefusedError) when it cannot be made; the message goes to the client."""


# -- helpers for backends: the two copy loops every exec/attach implementation needs ----------------------


async def copy_output(source: asyncio.StreamReader, sink: OutputStream | None, chunk: int = 65536) -> None:
    """Copy a process's output (a pipe, FIFO or socket reader) to the client until EOF.

    With sink None (the client did not ask for this output) the data is still drained, so the
    process never blocks on a full pipe."""
    while data := await source.read(chunk):
        if sink is not None:
            await sink.write(data)


async def copy_input(source: InputStream, dest: asyncio.StreamWriter, close: bool = True) -> None:
    """Copy the client's stdin to the process until the client closes it; then close dest (the
    process sees EOF) unless close is False (attach: the container's stdin stays open).

    A process that exited and closed its stdin ends the copy quietly."""
    try:
        while data := await source.read():
            dest.write(data)
            await dest.drain()
    except (BrokenPipeError, ConnectionResetError):
        return
    if close:
        if dest.can_write_eof():
            try:
                dest.write_eof()
                return
            except OSError:
                pass
        dest.close()
