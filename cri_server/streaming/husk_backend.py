"""The StreamBackend husk-cri uses: exec and attach through each container's husk-shim (ttrpc task API and
the shim's attach socket), port-forward by dialing inside the pod's network namespace.

Owns the copy loops between a StreamIO and a shim process. Must not parse any streaming protocol
(remotecommand.py does) nor look containers up itself (husk-cri's StreamTargets does).
"""
from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Awaitable, Callable

from shim import attach as shim_attach
from shim.client import AsyncTtrpcClient

from .backend import InputStream, OutputStream, ResizeQueue, StreamIO, TargetNotFound, TargetNotRunning, TerminalSize
from .netns import open_connection_in_netns
from .requests import AttachRequest, ExecRequest, PortForwardRequest
from .shimexec import CALL_TIMEOUT, AttachChannel, ShimError, ShimExec, close_shielded
from .targets import ContainerTarget, StreamTargets
from .transport import cancel_and_wait

__all__ = ["ContainerTarget", "HuskStreamBackend", "StreamTargets", "pump_output"]

log = logging.getLogger("husk.cri.streaming")

# How long a TTY exec waits for the client's first terminal size before it starts without one.
FIRST_SIZE_WAIT = 0.5


class AttachChannelLost(ConnectionError):
    """The shim closed an attach connection without an exit message (it dropped a client that fell
    too far behind, or the shim went away)."""


async def pump_output(channel: AttachChannel, stdout: OutputStream | None, stderr: OutputStream | None) -> int | None:
    """Copy a process's output from its attach channel to the client until the shim closes the channel.

    Returns the exit status the shim sent (after all output written before the exit), or None when
    the channel ended without one. Output nobody asked for is read and dropped."""
    status = None
    while (msg := await channel.recv()) is not None:
        kind, data = msg
        if kind == shim_attach.STDOUT:
            if stdout is not None:
                await stdout.write(data)
        elif kind == shim_attach.STDERR:
            if stderr is not None:
                await stderr.write(data)
        elif kind == shim_attach.EXIT and (code := shim_attach.exit_status(data)) is not None:
            status = code
    return status


async def _pump_stdin(source: InputStream, channel: AttachChannel, close: bool) -> None:
    """Client stdin into the process; at its end close the process's stdin if `close`."""
    try:
        while data := await source.read():
            await channel.write_stdin(data)
        if close:
            await channel.close_stdin()
    except OSError:
        return  # the process ended and the shim closed the channel: nothing left to feed


async def _drain(source: InputStream) -> None:
    while await source.read():
        pass


async def _pump_resize(queue: ResizeQueue, apply: Callable[[int, int], Awaitable[object]], cid: str) -> None:
    async for size in queue:
        if size.width == 0 or size.height == 0:
            continue  # kubelet ignores empty sizes too
        try:
            await apply(size.width, size.height)
        except (ShimError, ConnectionError, OSError, asyncio.TimeoutError) as err:
            log.warning("container %s: resize to %dx%d: %s", cid, size.width, size.height, err,
                        extra={"container_id": cid})


async def _first_size(queue: ResizeQueue, wait: float) -> TerminalSize | None:
    """The client's initial terminal size, if it comes within `wait` seconds (kubectl and crictl send it
    right after opening their streams; a client without a terminal never does)."""
    while True:
        try:
            size = await asyncio.wait_for(queue.get(), wait)
        except asyncio.TimeoutError:
            return None
        if size is None or (size.width and size.height):
            return size


class HuskStreamBackend:
    """StreamBackend over husk-shim. One ttrpc connection to the container's shim per session."""

    def __init__(self, targets: StreamTargets, first_size_wait: float = FIRST_SIZE_WAIT) -> None:
        self._targets = targets
        self._first_size_wait = first_size_wait

    async def _running(self, container_id: str) -> ContainerTarget:
        target = await self._targets.container(container_id)
        if target is None:
            raise TargetNotFound("container", container_id)
        if not target.running:
            raise TargetNotRunning("container", container_id)
        return target

    async def check(self, request: ExecRequest | AttachRequest | PortForwardRequest) -> None:
        if isinstance(request, PortForwardRequest):
            if await self._targets.sandbox_netns(request.pod_sandbox_id) is None:
                raise TargetNotFound("sandbox", request.pod_sandbox_id)
            return
        await self._running(request.container_id)

    async def exec(self, container_id: str, cmd: list[str], io: StreamIO) -> int:
        target = await self._running(container_id)
        first = await _first_size(io.resize, self._first_size_wait) if io.tty and io.resize is not None else None
        proc = await ShimExec.create(target.shim_address, container_id, cmd, tty=io.tty,
                                     stdin=io.stdin is not None, stdout=io.stdout is not None,
                                     stderr=io.stderr is not None,
                                     console_size=(first.width, first.height) if first is not None else None)
        extra = {"container_id": container_id}
        helpers: list[asyncio.Task] = []
        try:
            output = asyncio.create_task(pump_output(proc.channel, io.stdout, io.stderr))
            helpers.append(output)
            pid = await proc.start()
            log.info("container %s: exec %s started (pid %d): %s", container_id, proc.exec_id, pid, cmd, extra=extra)
            if io.stdin is not None:
                # A client that goes away ends stdin: the process sees EOF and runs on, as with kubelet.
                helpers.append(asyncio.create_task(_pump_stdin(io.stdin, proc.channel, close=True)))
            if io.resize is not None:
                helpers.append(asyncio.create_task(_pump_resize(io.resize, proc.resize, container_id)))
            code = await proc.wait()
            await output  # everything the process wrote reaches the client before the status
            return code
        except asyncio.CancelledError:
            log.info("container %s: exec %s cancelled; killing it", container_id, proc.exec_id, extra=extra)
            raise
        finally:
            await cancel_and_wait(*helpers)
            await close_shielded(proc)

    async def attach(self, container_id: str, io: StreamIO) -> None:
        target = await self._running(container_id)
        log.debug("container %s: attach (container tty=%s stdin=%s stdin_once=%s; session stdin=%s stdout=%s "
                  "stderr=%s)", container_id, target.tty, target.stdin, target.stdin_once, io.stdin is not None,
                  io.stdout is not None, io.stderr is not None, extra={"container_id": container_id})
        client = await AsyncTtrpcClient.connect(target.shim_address)
        channel: AttachChannel | None = None
        helpers: list[asyncio.Task] = []
        try:
            info = await client.husk("AttachInfo", timeout=CALL_TIMEOUT, id=container_id, exec_id="")
            channel = await AttachChannel.connect(info.path)
            output = asyncio.create_task(pump_output(channel, io.stdout, io.stderr))
            gone = asyncio.create_task(io.client_gone.wait())
            helpers += [output, gone]
            if io.stdin is not None:
                if target.stdin:
                    # Only a non-TTY StdinOnce container loses its stdin when a session ends it
                    # (containerd); the shim itself closes it when the first attached client leaves.
                    close = target.stdin_once and not target.tty
                    helpers.append(asyncio.create_task(_pump_stdin(io.stdin, channel, close=close)))
                else:
                    helpers.append(asyncio.create_task(_drain(io.stdin)))
            if io.resize is not None and target.tty:
                async def resize(width: int, height: int) -> None:
                    await client.task("ResizePty", timeout=CALL_TIMEOUT, id=container_id, width=width, height=height)
                helpers.append(asyncio.create_task(_pump_resize(io.resize, resize, container_id)))
            await asyncio.wait({output, gone}, return_when=asyncio.FIRST_COMPLETED)
            if output.done() and output.result() is None and not io.client_gone.is_set():
                raise AttachChannelLost(f"the shim of container {container_id!r} closed the attach channel "
                                        "before the container exited (client too slow, or the shim is gone)")
        finally:
            await cancel_and_wait(*helpers)
            if channel is not None:
                channel.close()  # detach: the container keeps running
            await client.close()

    async def port_forward(self, sandbox_id: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        netns = await self._targets.sandbox_netns(sandbox_id)
        if netns is None:
            raise FileNotFoundError(errno.ENOENT, f"sandbox {sandbox_id!r} not found")
        # "" is a host-network pod: dial on the host's own stack.
        return await open_connection_in_netns(netns or None, port)
