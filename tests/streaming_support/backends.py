"""Real StreamBackends for tests: commands run as host processes (with a pty for TTY sessions),
"containers" are long-running host processes whose stdio is fanned out to attach sessions, and
port-forward dials 127.0.0.1 (or a test-chosen dialer, e.g. inside a network namespace)."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import signal
import struct
import termios
from collections.abc import Awaitable, Callable

from cri_server.streaming import AttachRequest, ExecRequest, PortForwardRequest, StreamIO, TargetNotFound, \
    TerminalSize
from cri_server.streaming.backend import copy_input, copy_output


def _set_winsize(fd: int, size: TerminalSize) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.height, size.width, 0, 0))


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class PtyMaster:
    """Non-blocking reads/writes on a pty master fd, on the event loop."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._loop = asyncio.get_running_loop()

    async def read(self) -> bytes:
        while True:
            try:
                return os.read(self.fd, 65536)
            except BlockingIOError:
                await self._wait(self._loop.add_reader, self._loop.remove_reader)
            except OSError as exc:
                if exc.errno == errno.EIO:  # every slave fd closed: the session is over
                    return b""
                raise

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
                view = view[n:]
            except BlockingIOError:
                await self._wait(self._loop.add_writer, self._loop.remove_writer)

    async def _wait(self, add, remove) -> None:
        fut = self._loop.create_future()
        add(self.fd, lambda: fut.done() or fut.set_result(None))
        try:
            await fut
        finally:
            remove(self.fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class HostContainer:
    """A 'container' for attach tests: one host process; its output fans out to every attached session."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.sinks: list[tuple[StreamIO, asyncio.Event]] = []
        self.done = asyncio.Event()
        self.pumps = [asyncio.create_task(self._fan_out(proc.stdout, "stdout")),
                      asyncio.create_task(self._fan_out(proc.stderr, "stderr"))]

    async def _fan_out(self, reader: asyncio.StreamReader | None, which: str) -> None:
        if reader is None:
            return
        while data := await reader.read(65536):
            for io, _ in list(self.sinks):
                sink = io.stdout if which == "stdout" or io.tty else io.stderr
                if sink is not None:
                    await sink.write(data)
        if which == "stdout":
            self.done.set()


class HostBackend:
    """exec = a host process; attach = a HostContainer; port-forward = a TCP dial (127.0.0.1 default).

    Records what the protocol layer delivered (resizes, disconnects) so tests can assert on it."""

    def __init__(self, containers: tuple[str, ...] = ("c1",), sandboxes: tuple[str, ...] = ("s1",),
                 dial: Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
                 | None = None) -> None:
        self.container_ids = set(containers)
        self.sandbox_ids = set(sandboxes)
        self.dial = dial
        self.attachables: dict[str, HostContainer] = {}
        self.pids: list[int] = []
        self.procs: list[asyncio.subprocess.Process] = []
        self.resizes: list[TerminalSize] = []
        self.resize_seen = asyncio.Event()
        self.disconnects = 0
        self.disconnect_seen = asyncio.Event()
        self.started = asyncio.Event()
        self.exec_cancelled = 0
        self.forward_targets: list[int] = []

    # -- test helpers -------------------------------------------------------------------------------------

    async def start_container(self, cid: str, cmd: list[str]) -> HostContainer:
        proc = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE, start_new_session=True)
        self.procs.append(proc)
        self.pids.append(proc.pid)
        c = HostContainer(proc)
        self.attachables[cid] = c
        self.container_ids.add(cid)
        return c

    async def close(self) -> None:
        for c in self.attachables.values():
            _kill_group(c.proc.pid)
            await c.proc.wait()
            for t in c.pumps:
                t.cancel()
            await asyncio.gather(*c.pumps, return_exceptions=True)

    def leaked_pids(self) -> list[int]:
        """Processes this backend started that still exist (not reaped)."""
        leaked = []
        for p in self.procs:
            if p.returncode is None:
                leaked.append(p.pid)
        for pid in self.pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state != "Z" and pid not in leaked:
                leaked.append(pid)
        return leaked

    # -- StreamBackend ------------------------------------------------------------------------------------

    async def check(self, request: ExecRequest | AttachRequest | PortForwardRequest) -> None:
        if isinstance(request, PortForwardRequest):
            if request.pod_sandbox_id not in self.sandbox_ids:
                raise TargetNotFound("sandbox", request.pod_sandbox_id)
        elif request.container_id not in self.container_ids:
            raise TargetNotFound("container", request.container_id)

    async def exec(self, container_id: str, cmd: list[str], io: StreamIO) -> int:
        watcher = asyncio.create_task(self._watch_gone(io))
        try:
            if io.tty:
                return await self._exec_tty(cmd, io)
            return await self._exec_pipes(cmd, io)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def _watch_gone(self, io: StreamIO) -> None:
        await io.client_gone.wait()
        self.disconnects += 1
        self.disconnect_seen.set()

    async def _exec_pipes(self, cmd: list[str], io: StreamIO) -> int:
        pipe, null = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=pipe if io.stdin else null, stdout=pipe if io.stdout else null,
            stderr=pipe if io.stderr else null, start_new_session=True)
        self.procs.append(proc)
        self.pids.append(proc.pid)
        self.started.set()

        async def feed() -> None:
            assert proc.stdin is not None and io.stdin is not None
            await copy_input(io.stdin, proc.stdin)

        async def pump(src: asyncio.StreamReader | None, sink) -> None:
            if src is not None:
                await copy_output(src, sink)

        feeder = asyncio.create_task(feed()) if io.stdin else None
        pumps = [asyncio.create_task(pump(proc.stdout, io.stdout)), asyncio.create_task(pump(proc.stderr, io.stderr))]
        try:
            await asyncio.gather(*pumps)
            return await proc.wait()
        except asyncio.CancelledError:
            self.exec_cancelled += 1
            _kill_group(proc.pid)
            await proc.wait()
            raise
        finally:
            for t in [feeder, *pumps]:
                if t is not None:
                    t.cancel()
            await asyncio.gather(*[t for t in [feeder, *pumps] if t is not None], return_exceptions=True)

    async def _exec_tty(self, cmd: list[str], io: StreamIO) -> int:
        master_fd, slave_fd = os.openpty()
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=slave_fd, stdout=slave_fd, stderr=slave_fd, start_new_session=True,
                preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
        except BaseException:
            os.close(master_fd)
            raise
        finally:
            os.close(slave_fd)
        self.procs.append(proc)
        self.pids.append(proc.pid)
        self.started.set()
        master = PtyMaster(master_fd)

        async def feed() -> None:
            assert io.stdin is not None
            while data := await io.stdin.read():
                await master.write(data)

        async def resize() -> None:
            assert io.resize is not None
            async for size in io.resize:
                _set_winsize(master_fd, size)
                self.resizes.append(size)
                self.resize_seen.set()

        async def pump() -> None:
            while data := await master.read():
                if io.stdout is not None:
                    await io.stdout.write(data)

        helpers = [asyncio.create_task(feed()) if io.stdin else None,
                   asyncio.create_task(resize()) if io.resize else None]
        out = asyncio.create_task(pump())
        try:
            code = await proc.wait()
            await out  # EIO once the process and its children closed the slave
            return code
        except asyncio.CancelledError:
            self.exec_cancelled += 1
            _kill_group(proc.pid)
            await proc.wait()
            raise
        finally:
            live = [t for t in [*helpers, out] if t is not None]
            for t in live:
                t.cancel()
            await asyncio.gather(*live, return_exceptions=True)
            master.close()

    async def attach(self, container_id: str, io: StreamIO) -> None:
        c = self.attachables.get(container_id)
        if c is None:
            raise RuntimeError(f"container {container_id} has no attachable process")
        gone = asyncio.Event()
        entry = (io, gone)
        c.sinks.append(entry)

        async def feed() -> None:
            assert io.stdin is not None and c.proc.stdin is not None
            # Unlike exec, an attach session ending its stdin does not close the container's stdin
            # (kubelet's StdinOnce is the runtime's business, not the streaming server's).
            await copy_input(io.stdin, c.proc.stdin, close=False)

        feeder = asyncio.create_task(feed()) if io.stdin else None
        waits = [asyncio.create_task(c.done.wait()), asyncio.create_task(io.client_gone.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if io.client_gone.is_set():
                self.disconnects += 1
                self.disconnect_seen.set()
        finally:
            c.sinks.remove(entry)
            for t in [feeder, *waits]:
                if t is not None:
                    t.cancel()
            await asyncio.gather(*[t for t in [feeder, *waits] if t is not None], return_exceptions=True)

    async def port_forward(self, sandbox_id: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self.forward_targets.append(port)
        if self.dial is not None:
            return await self.dial(sandbox_id, port)
        return await asyncio.open_connection("127.0.0.1", port)
