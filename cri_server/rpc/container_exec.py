"""ExecSync, ReopenContainerLog and UpdateContainerResources: calls into a running container's shim.

ExecSync runs a command with the container's process settings (user, env, cwd, capabilities) through the
shim's Exec, reads its output from the exec's attach channel (stdout and stderr apart, each capped at
16 MiB as kubelet expects) and on timeout kills only that process. No streaming sessions here.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import secrets
import signal as signals
import socket
import struct
from dataclasses import dataclass

from cri_server.api.v1 import api_pb2 as pb
from cri_server.context import Services
from cri_server.errors import DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument, NotFound
from cri_server.shims import ShimGone
from cri_server.spec.resources import linux_resources
from cri_server.store.records import ContainerRecord, ContainerState

log = logging.getLogger(__name__)

MAX_OUTPUT = 16 << 20          # per stream (kubelet's limit; CVE-2022-1708)
PROCESS_TYPE_URL = "types.containerd.io/opencontainers/runtime-spec/1/Process"
_ATTACH_STDOUT, _ATTACH_STDERR, _ATTACH_EXIT = 0x01, 0x02, 0x03
_PACKET = 64 * 1024 + 1
# After a timeout kill, how long the exit may take to arrive before we stop waiting for it.
_KILL_GRACE = 10.0


@dataclass
class ExecResult:
    stdout: bytes
    stderr: bytes
    exit_code: int


def running_container(svc: Services, container_id: str) -> ContainerRecord:
    rec = svc.store.get_container(container_id)
    if rec.state != ContainerState.RUNNING or not rec.shim_address:
        raise FailedPrecondition(f"container {rec.id} is not running ({rec.state.value})")
    return rec


def exec_process(bundle: str, cmd: list[str], tty: bool = False) -> dict:
    """The OCI process of an exec: the container's own (user, env, cwd, capabilities, rlimits, no_new_privs)
    with the command's args, as containerd's CRI plugin builds it."""
    try:
        with open(os.path.join(bundle, "config.json")) as f:
            process = json.load(f)["process"]
    except (OSError, ValueError, KeyError) as e:
        raise Internal(f"read the container's process spec from {bundle}: {e}") from None
    process["args"] = list(cmd)
    process["terminal"] = tty
    process.pop("consoleSize", None)
    return process


class _Collector:
    def __init__(self) -> None:
        self.out = bytearray()
        self.err = bytearray()
        self.exit: int | None = None

    def add(self, buf: bytearray, data: bytes) -> None:
        room = MAX_OUTPUT - len(buf)
        if room > 0:
            buf += data[:room]


async def _read_attach(sock: socket.socket, col: _Collector) -> None:
    loop = asyncio.get_running_loop()
    while True:
        pkt = await loop.sock_recv(sock, _PACKET)
        if not pkt:
            return
        kind, data = pkt[0], pkt[1:]
        if kind == _ATTACH_STDOUT:
            col.add(col.out, data)
        elif kind == _ATTACH_STDERR:
            col.add(col.err, data)
        elif kind == _ATTACH_EXIT and len(data) >= 4:
            col.exit = struct.unpack(">I", data[:4])[0]
            return


def _connect_seqpacket(path: str) -> socket.socket:
    from shim.unixpath import connect_unix
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        connect_unix(s, path)
    except OSError:
        s.close()
        raise
    s.setblocking(False)
    return s


async def run_exec(svc: Services, rec: ContainerRecord, cmd: list[str], timeout: float | None) -> ExecResult:
    """Runs `cmd` in the container and collects its output; DeadlineExceeded (after killing the process)
    when it runs longer than `timeout` seconds."""
    from shim import ttrpc_wire as w
    from shim.pb import google
    shims = svc.need_shims()
    bundle = rec.extra.get("bundle") or svc.bundle_dir(rec.id)
    process = exec_process(bundle, cmd)
    exec_id = "exec-" + secrets.token_hex(8)
    addr = rec.shim_address
    spec = google.Any(type_url=PROCESS_TYPE_URL, value=json.dumps(process).encode())

    async def call(method: str, **fields: object) -> object:
        return await shims.call(rec.id, addr, method, timeout=30.0, id=rec.id, exec_id=exec_id, **fields)

    try:
        await shims.call(rec.id, addr, "Exec", timeout=30.0, id=rec.id, exec_id=exec_id, terminal=False,
                         stdin="", stdout="attach:", stderr="attach:", spec=spec)
    except w.TtrpcError as e:
        if e.code == w.FAILED_PRECONDITION:
            raise FailedPrecondition(f"container {rec.id} is not running") from None
        raise Internal(f"exec in container {rec.id}: {e.message}") from None
    except ShimGone:
        raise FailedPrecondition(f"container {rec.id} is not running") from None
    col = _Collector()
    sock: socket.socket | None = None
    try:
        info = await shims.husk_call(rec.id, addr, "AttachInfo", id=rec.id, exec_id=exec_id)
        sock = _connect_seqpacket(info.path)
        try:
            await call("Start")
        except w.TtrpcError as e:
            raise Internal(f"exec {cmd[0]!r} in container {rec.id}: {e.message}") from None
        reader = asyncio.ensure_future(_read_attach(sock, col))
        try:
            await asyncio.wait_for(asyncio.shield(reader), timeout)
        except asyncio.TimeoutError:
            await _kill(call)
            try:
                await asyncio.wait_for(reader, _KILL_GRACE)
            except asyncio.TimeoutError:
                reader.cancel()
            raise DeadlineExceeded(f"command {cmd!r} timed out after {timeout:g}s; the process was killed") \
                from None
        except BaseException:
            await _kill(call)
            reader.cancel()
            raise
        if col.exit is None:
            # The attach client was dropped (too far behind): the exit status still comes from Wait.
            resp = await call("Wait")
            col.exit = int(resp.exit_status)  # type: ignore[attr-defined]
        return ExecResult(bytes(col.out), bytes(col.err), col.exit)
    finally:
        if sock is not None:
            sock.close()
        await asyncio.shield(_delete_exec(call, rec.id, exec_id))


async def _kill(call: object) -> None:
    from shim import ttrpc_wire as w
    try:
        # all: the exec's whole process group (a shell's children too), where the shim supports it.
        await call("Kill", signal=signals.SIGKILL, all=True)  # type: ignore[operator]
    except (w.TtrpcError, ShimGone):
        pass


async def _delete_exec(call: object, container_id: str, exec_id: str) -> None:
    from shim import ttrpc_wire as w
    for attempt in range(50):
        try:
            await call("Delete")  # type: ignore[operator]
            return
        except w.TtrpcError as e:
            if e.code != w.FAILED_PRECONDITION:
                return
        except ShimGone:
            return
        # Still running (killed, exit not yet reaped): try again shortly.
        await asyncio.sleep(0.05 if attempt < 20 else 0.2)
    log.warning("exec process not deleted", extra={"id": container_id, "exec_id": exec_id})


async def exec_sync(svc: Services, req: pb.ExecSyncRequest) -> pb.ExecSyncResponse:
    """ExecSync runs a command in a running container and returns its output and exit code."""
    if not req.cmd:
        raise InvalidArgument("cmd: must not be empty")
    if req.timeout < 0:
        raise InvalidArgument("timeout: must not be negative")
    rec = running_container(svc, req.container_id)
    res = await run_exec(svc, rec, list(req.cmd), req.timeout or None)
    return pb.ExecSyncResponse(stdout=res.stdout, stderr=res.stderr, exit_code=res.exit_code)


async def reopen_container_log(svc: Services, req: pb.ReopenContainerLogRequest) -> pb.ReopenContainerLogResponse:
    """ReopenContainerLog makes the shim reopen the log file after kubelet renamed it (rotation); the
    container must be running."""
    from shim import ttrpc_wire as w
    rec = running_container(svc, req.container_id)
    if not rec.log_path:
        raise FailedPrecondition(f"container {rec.id} has no log file")
    try:
        await svc.need_shims().husk_call(rec.id, rec.shim_address, "ReopenLog", id=rec.id)
    except w.TtrpcError as e:
        raise Internal(f"reopen the log of container {rec.id}: {e.message}") from None
    except ShimGone:
        raise FailedPrecondition(f"container {rec.id} is not running") from None
    return pb.ReopenContainerLogResponse()


async def update_container_resources(svc: Services,
                                     req: pb.UpdateContainerResourcesRequest) -> pb.UpdateContainerResourcesResponse:
    """UpdateContainerResources applies new cgroup limits to a running (or created) container at once and
    records them, so ContainerStatus reports them."""
    from shim import ttrpc_wire as w
    from shim.pb import google
    rec = svc.store.get_container(req.container_id)
    async with svc.locks.hold(rec.id):
        rec = svc.store.get_container(rec.id)
        if rec.state not in (ContainerState.RUNNING, ContainerState.CREATED) or not rec.shim_address:
            raise FailedPrecondition(f"container {rec.id} is {rec.state.value}: its resources cannot change")
        if not req.HasField("linux"):
            return pb.UpdateContainerResourcesResponse()
        resources = linux_resources(req.linux, "linux", svc.host.swap_controller if svc.host else False)
        try:
            await svc.need_shims().call(rec.id, rec.shim_address, "Update", id=rec.id,
                                        resources=google.Any(type_url="types.containerd.io/opencontainers/"
                                                             "runtime-spec/1/LinuxResources",
                                                             value=json.dumps(resources).encode()))
        except w.TtrpcError as e:
            if e.code == w.NOT_FOUND:
                raise NotFound(f"container {rec.id}: {e.message}") from None
            raise Internal(f"update the resources of container {rec.id}: {e.message}") from None
        except ShimGone:
            raise FailedPrecondition(f"container {rec.id} is not running") from None
        config = pb.ContainerConfig.FromString(rec.config) if rec.config else pb.ContainerConfig()
        config.linux.resources.CopyFrom(req.linux)
        svc.store.put_container(dataclasses.replace(svc.store.get_container(rec.id),
                                                    config=config.SerializeToString()))
    return pb.UpdateContainerResourcesResponse()
