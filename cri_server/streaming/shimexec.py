"""Processes in a container through its husk-shim: one exec's life (Exec, attach, Start, Wait, Kill, Delete)
over the attach socket (its asyncio client is shim/attach.py's AsyncAttachClient). Shared by the streaming
backend and ExecSync.

Owns the ttrpc calls and the attach-channel protocol for one process. Must not know HTTP, SPDY,
WebSocket or CRI messages.
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import os
import secrets
import signal
from collections.abc import Sequence
from typing import Any

from shim import attach as shim_attach
from shim import ttrpc_wire
from shim.client import AsyncTtrpcClient
from shim.pb import google

log = logging.getLogger("husk.cri.streaming")

# The type containerd gives the OCI process it sends with Exec (the shim reads the JSON, not the name).
PROCESS_SPEC_TYPE = "types.containerd.io/opencontainers/runtime-spec/1/Process"
# How long cleanup waits for a killed exec to be reaped before deleting it anyway.
KILL_WAIT = 10.0
# Ttrpc calls other than Wait: the shim answers at once unless its runtime hangs.
CALL_TIMEOUT = 60.0

ShimError = ttrpc_wire.TtrpcError


def _quiet_codes(err: BaseException, *codes: int) -> bool:
    return isinstance(err, ShimError) and err.code in codes


# One connection to a process's attach socket: the shim's own asyncio client (shim/attach.py).
AttachChannel = shim_attach.AsyncAttachClient


def exec_process_spec(container_process: dict[str, Any], cmd: Sequence[str], tty: bool,
                      console_size: tuple[int, int] | None = None) -> dict[str, Any]:
    """The OCI process of an exec: the container's own process (user, env, cwd, capabilities, rlimits,
    no_new_privileges, AppArmor/SELinux labels) with the exec's args and terminal, as containerd's CRI
    plugin builds it. A TTY gets TERM=xterm (replacing any TERM) and, when the client already sent its
    size, that size as consoleSize (width, height): the runtime sizes the terminal before the process
    runs, so a first `stty size` cannot see 0 0."""
    spec = copy.deepcopy(container_process)
    spec["args"] = list(cmd)
    spec.pop("commandLine", None)  # Windows-only, and it would override args
    spec["terminal"] = bool(tty)
    if tty:
        env = [e for e in spec.get("env") or [] if not e.startswith("TERM=")]
        spec["env"] = env + ["TERM=xterm"]
        if console_size is not None:
            spec["consoleSize"] = {"width": console_size[0], "height": console_size[1]}
        else:
            spec.pop("consoleSize", None)  # the container's own size is not the client's
    else:
        spec.pop("consoleSize", None)
    return spec


def load_container_process(bundle: str) -> dict[str, Any]:
    """The `process` object of the container's config.json in its bundle."""
    path = os.path.join(bundle, "config.json")
    with open(path, "rb") as f:
        config = json.load(f)
    process = config.get("process") if isinstance(config, dict) else None
    if not isinstance(process, dict):
        raise ValueError(f"{path}: no process object")
    return process


def new_exec_id() -> str:
    return secrets.token_hex(16)


class ShimExec:
    """One exec in a container, through the container's shim: created with create(), then start(),
    wait() for the exit status, close() to delete it from the shim (killing it first if it still runs).

    Output arrives on `channel` (attached before Start, so nothing is missed), followed by an EXIT
    message once the shim has drained what the process wrote before exiting."""

    def __init__(self, client: AsyncTtrpcClient, container_id: str, exec_id: str, channel: AttachChannel) -> None:
        self.client = client
        self.container_id = container_id
        self.exec_id = exec_id
        self.channel = channel
        self.pid = 0
        self.exit_status: int | None = None
        self._wait: asyncio.Task[int] | None = None
        self._closed = False

    @classmethod
    async def create(cls, shim_address: str, container_id: str, cmd: Sequence[str], *, tty: bool,
                     stdin: bool, stdout: bool, stderr: bool,
                     console_size: tuple[int, int] | None = None) -> ShimExec:
        """Exec (not started yet) with the container's process settings; stdio through the attach socket."""
        client = await AsyncTtrpcClient.connect(shim_address)
        exec_id = new_exec_id()
        created = False
        try:
            state = await client.task("State", timeout=CALL_TIMEOUT, id=container_id)
            process = exec_process_spec(load_container_process(state.bundle), cmd, tty, console_size)
            spec = google.Any(type_url=PROCESS_SPEC_TYPE, value=json.dumps(process).encode())
            await client.task("Exec", timeout=CALL_TIMEOUT, id=container_id, exec_id=exec_id, terminal=tty,
                              stdin="attach:" if stdin else "", stdout="attach:" if stdout else "",
                              stderr="attach:" if stderr and not tty else "", spec=spec)
            created = True
            info = await client.husk("AttachInfo", timeout=CALL_TIMEOUT, id=container_id, exec_id=exec_id)
            channel = await AttachChannel.connect(info.path)
        except BaseException:
            if created:
                with contextlib.suppress(ShimError, ConnectionError, OSError, asyncio.TimeoutError):
                    await client.task("Delete", timeout=CALL_TIMEOUT, id=container_id, exec_id=exec_id)
            await client.close()
            raise
        log.debug("container %s: exec %s created: %s", container_id, exec_id, list(cmd),
                  extra={"container_id": container_id})
        return cls(client, container_id, exec_id, channel)

    async def start(self) -> int:
        # Wait is asked before Start, so an exit right after Start cannot be missed.
        self._wait = asyncio.create_task(self._wait_exit(), name=f"exec-wait-{self.exec_id}")
        resp = await self.client.task("Start", timeout=CALL_TIMEOUT, id=self.container_id, exec_id=self.exec_id)
        self.pid = resp.pid
        return self.pid

    async def _wait_exit(self) -> int:
        resp = await self.client.task("Wait", timeout=None, id=self.container_id, exec_id=self.exec_id)
        self.exit_status = resp.exit_status
        return resp.exit_status

    async def wait(self) -> int:
        """The exit status (128+n for signal n) once the process exited."""
        if self._wait is None:
            raise RuntimeError(f"exec {self.exec_id} was not started")
        return await asyncio.shield(self._wait)

    async def kill(self, sig: int = signal.SIGKILL, group: bool = True) -> None:
        """Signal the exec (group: its whole process group, so its children too). A process that
        already exited is not an error."""
        try:
            await self.client.task("Kill", timeout=CALL_TIMEOUT, id=self.container_id, exec_id=self.exec_id,
                                   signal=sig, all=group)
        except ShimError as err:
            if err.code != ttrpc_wire.NOT_FOUND:
                raise

    async def resize(self, width: int, height: int) -> None:
        await self.client.task("ResizePty", timeout=CALL_TIMEOUT, id=self.container_id, exec_id=self.exec_id,
                               width=width, height=height)

    async def close(self) -> None:
        """Kill the process if it still runs, wait for its exit (bounded), delete it from the shim."""
        if self._closed:
            return
        self._closed = True
        cid = self.container_id
        try:
            if self._wait is not None and not self._wait.done():
                try:
                    await self.kill(signal.SIGKILL, group=True)
                except (ShimError, ConnectionError, OSError, asyncio.TimeoutError) as err:
                    log.warning("container %s: killing exec %s: %s", cid, self.exec_id, err,
                                extra={"container_id": cid})
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait({self._wait}, timeout=KILL_WAIT)
            try:
                await self.client.task("Delete", timeout=CALL_TIMEOUT, id=cid, exec_id=self.exec_id)
            except (ShimError, ConnectionError, OSError, asyncio.TimeoutError) as err:
                if not _quiet_codes(err, ttrpc_wire.NOT_FOUND):
                    log.warning("container %s: deleting exec %s: %s", cid, self.exec_id, err,
                                extra={"container_id": cid})
        finally:
            self.channel.close()
            if self._wait is not None and not self._wait.done():
                self._wait.cancel()
            if self._wait is not None:
                await asyncio.gather(self._wait, return_exceptions=True)
            await self.client.close()


# The closes under way (close_shielded): one whose session was cancelled runs on by itself, held here (the
# loop keeps only weak references to tasks) until it ends, and husk-cri's shutdown waits for it (drain_closes)
# instead of ending the loop under it, which left the exec's process running in its container and the exec in
# its shim.
_closing: "set[asyncio.Task[None]]" = set()


async def close_shielded(proc: ShimExec) -> None:
    """proc.close() that runs to its end even when the caller is cancelled (again) meanwhile: a
    cancelled session must still kill and delete its exec."""
    task = asyncio.ensure_future(proc.close())
    _closing.add(task)
    task.add_done_callback(_closing.discard)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        raise


async def drain_closes(timeout: float) -> int:
    """Waits up to `timeout` seconds for the closes still under way on this loop (those of cancelled
    sessions: ExecSync calls and streaming sessions ended by a shutdown); returns how many did not end."""
    loop = asyncio.get_running_loop()
    for t in [t for t in _closing if t.get_loop().is_closed()]:
        _closing.discard(t)           # left pending by a loop that is gone (a test's): nothing can end them
    pending = [t for t in _closing if t.get_loop() is loop]
    if not pending:
        return 0
    _done, left = await asyncio.wait(pending, timeout=timeout)
    if left:
        log.warning("%d exec cleanups still running after %gs; leaving them", len(left), timeout)
    return len(left)
