"""ExecSync for husk-cri: run a command in a container through its shim, capture its output, honour a timeout.

Owns the capture (each stream capped, the rest drained and dropped) and the timeout (kill the exec's
process group only, never the container). Must not build CRI messages: husk-cri maps the result.
"""
from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from shim import attach as shim_attach

from .shimexec import KILL_WAIT, AttachChannel, ShimExec, close_shielded

log = logging.getLogger("husk.cri.streaming")

# kubelet's CRI client refuses messages over 16 MiB; containerd caps each stream at this (CVE-2022-1708).
MAX_OUTPUT = 16 * 1024 * 1024


@dataclass(frozen=True)
class ExecSyncResult:
    stdout: bytes
    stderr: bytes
    exit_code: int  # 128+n for signal n
    stdout_truncated: bool = False
    stderr_truncated: bool = False


class ExecSyncTimeout(TimeoutError):
    """The command ran longer than its timeout; it was killed (with its process group) and reaped.
    husk-cri answers DEADLINE_EXCEEDED, which kubelet reads as a probe timeout."""

    def __init__(self, container_id: str, cmd: Sequence[str], timeout: float) -> None:
        super().__init__(f"command {list(cmd)!r} in container {container_id!r} timed out after {timeout:g}s")
        self.container_id = container_id
        self.cmd = list(cmd)
        self.timeout = timeout


class _Capped:
    def __init__(self, limit: int) -> None:
        self.buf = bytearray()
        self.limit = limit
        self.truncated = False

    def add(self, data: bytes) -> None:
        room = self.limit - len(self.buf)
        if len(data) > room:
            self.truncated = True
            data = data[:max(room, 0)]
        self.buf += data


async def _collect(channel: AttachChannel, out: _Capped, err: _Capped) -> None:
    while (msg := await channel.recv()) is not None:
        kind, data = msg
        if kind == shim_attach.STDOUT:
            out.add(data)
        elif kind == shim_attach.STDERR:
            err.add(data)
        elif kind == shim_attach.EXIT and (code := shim_attach.exit_status(data)) is not None:
            log.debug("exec exit status %d on the attach channel", code)


async def exec_sync(shim_address: str, container_id: str, cmd: Sequence[str], timeout: float | None = None,
                    *, max_output: int = MAX_OUTPUT) -> ExecSyncResult:
    """Run cmd in the container (its user, env, cwd, capabilities: the container's process settings),
    without stdin and without a TTY; return its output and exit code.

    timeout: seconds (None or 0: no limit, as CRI's 0). On timeout the exec's process group is
    SIGKILLed and reaped, then ExecSyncTimeout is raised. Errors from the shim (container not running,
    unknown container) come as shim.ttrpc_wire.TtrpcError; a shim that went away as ConnectionError."""
    if not cmd:
        raise ValueError("cmd: missing the command to run")
    proc = await ShimExec.create(shim_address, container_id, cmd, tty=False, stdin=False, stdout=True, stderr=True)
    out, err = _Capped(max_output), _Capped(max_output)
    collector = asyncio.create_task(_collect(proc.channel, out, err))
    extra = {"container_id": container_id}
    try:
        await proc.start()
        try:
            if timeout:
                code = await asyncio.wait_for(proc.wait(), timeout)
            else:
                code = await proc.wait()
        except asyncio.TimeoutError:
            log.info("container %s: exec %s %s timed out after %gs; killing its process group",
                     container_id, proc.exec_id, list(cmd), timeout, extra=extra)
            await proc.kill(signal.SIGKILL, group=True)
            await asyncio.wait_for(proc.wait(), KILL_WAIT)
            raise ExecSyncTimeout(container_id, cmd, float(timeout or 0)) from None
        # The shim ends the channel right after the output written before the exit (a background
        # child that keeps the pipe open does not hold this up).
        await collector
        return ExecSyncResult(bytes(out.buf), bytes(err.buf), code, out.truncated, err.truncated)
    finally:
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)
        await close_shielded(proc)
