"""Task exits: one watcher per live sandbox or container task, waiting on its shim (ttrpc Wait).

When a task exits the watcher writes the exit (code, time, OOM) into its record as pending (`PENDING_EXIT`,
committed), deletes the task (the shim then drops the task and its exit file), records the exit (reason
Completed/Error/OOMKilled; a sandbox turns NotReady), ends the shim once no other task of the pod uses it (the
pod's containers run in the sandbox's shim) and publishes the event. A husk-cri killed between the Delete and
the record finds the pending exit at the next start (recovery), so the exit status is never lost. A shim
that vanished is read from its durable exit file, or reported as exit 255. Other code waits for exits here
(StopContainer, StopPodSandbox) instead of polling. Owns no RPC logic.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal as signals
import sqlite3
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from cri_server.shims import ShimGone
from cri_server.store.records import ContainerRecord, ContainerState, SandboxRecord, SandboxState

if TYPE_CHECKING:
    from cri_server.context import Services

log = logging.getLogger(__name__)

REASON_COMPLETED = "Completed"
REASON_ERROR = "Error"
REASON_OOM = "OOMKilled"
REASON_UNKNOWN = "Unknown"
SHIM_GONE_EXIT = 255
# Record extra: the exit the watcher read, kept (committed) until the task's Delete is done and the exit recorded.
PENDING_EXIT = "exit_pending"


@dataclass(frozen=True)
class ExitInfo:
    exit_code: int
    exited_at: int          # ns since the epoch
    oom: bool = False
    message: str = ""

    @property
    def reason(self) -> str:
        if self.oom:
            return REASON_OOM
        if self.message:
            return REASON_UNKNOWN
        return REASON_COMPLETED if self.exit_code == 0 else REASON_ERROR


def pending_exit(rec: ContainerRecord | SandboxRecord | None) -> ExitInfo | None:
    """The exit a watcher read and had not recorded yet when husk-cri stopped (its Delete may have removed the
    task and the shim's exit file already), None if there is none."""
    doc = rec.extra.get(PENDING_EXIT) if rec is not None else None
    if not isinstance(doc, dict):
        return None
    try:
        return ExitInfo(int(doc["code"]), int(doc["at"]), bool(doc.get("oom", False)), str(doc.get("message", "")))
    except (KeyError, TypeError, ValueError):
        log.warning("ignoring a malformed pending exit", extra={"id": rec.id if rec else "", "pending": doc})
        return None


def _ts_ns(ts: Any) -> int:
    if ts is None:
        return 0
    return int(ts.seconds) * 1_000_000_000 + int(ts.nanos)


class TaskMonitor:
    def __init__(self, svc: "Services", on_stopped: Callable[[str], None] | None = None) -> None:
        """on_stopped(object_id) is called once a task's exit is recorded (husk-cri publishes the CRI
        container event with it; it is passed in so that this module does not import the RPC layer)."""
        self.svc = svc
        self._on_stopped = on_stopped
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._closing = False

    # --- watching ----------------------------------------------------------------------------
    def watch(self, object_id: str) -> None:
        """Starts waiting for the exit of the task of `object_id` (a sandbox or a container record)."""
        t = self._watchers.get(object_id)
        if t is not None and not t.done():
            return
        self._watchers[object_id] = asyncio.get_running_loop().create_task(self._watch(object_id),
                                                                           name=f"exit-watch-{object_id[:12]}")

    def watching(self, object_id: str) -> bool:
        t = self._watchers.get(object_id)
        return t is not None and not t.done()

    async def wait_exit(self, object_id: str, timeout: float | None) -> bool:
        """True once the exit of `object_id` has been recorded (at once if nothing runs), False on timeout."""
        t = self._watchers.get(object_id)
        if t is None or t.done():
            return True
        try:
            await asyncio.wait_for(asyncio.shield(t), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """husk-cri is stopping: stop waiting (the tasks keep running; the next husk-cri watches them)."""
        self._closing = True
        tasks = [t for t in self._watchers.values() if not t.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watchers.clear()

    def _address(self, object_id: str) -> str:
        store = self.svc.store
        rec: ContainerRecord | SandboxRecord | None = store.record(object_id)
        return rec.shim_address if rec is not None else ""

    async def _watch(self, object_id: str) -> None:
        from shim import ttrpc_wire as w
        shims = self.svc.need_shims()
        address = self._address(object_id)
        if not address:
            return
        info: ExitInfo
        # Set when a previous husk-cri read the exit and was stopped before recording it: its Delete may have
        # removed the task and its exit file.
        pending = pending_exit(self.svc.store.record(object_id))
        try:
            resp = await shims.call(object_id, address, "Wait", timeout=None, id=object_id)
            rec = shims.exit_record(object_id)
            info = ExitInfo(int(resp.exit_status), _ts_ns(resp.exited_at) or time.time_ns(),
                            bool(rec and rec.oom_killed))
        except ShimGone as e:
            rec = shims.exit_record(object_id)
            if rec is not None:
                info = ExitInfo(rec.exit_status, rec.exited_at_ns, rec.oom_killed)
            else:
                info = pending or ExitInfo(SHIM_GONE_EXIT, time.time_ns(), message=f"the shim exited: {e}")
                await self._kill_orphan(object_id)
        except w.TtrpcError as e:
            if e.code != w.NOT_FOUND:
                log.error("waiting for the task failed", extra={"id": object_id, "error": str(e)})
            info = pending or ExitInfo(SHIM_GONE_EXIT, time.time_ns(), message=f"task lost: {e}")
        except asyncio.CancelledError:
            raise
        await self._finish(object_id, address, info)

    async def _finish(self, object_id: str, address: str, info: ExitInfo) -> None:
        """Keeps the exit as pending (committed), deletes the task, records the exit and ends the shim (every
        step tolerates a gone shim). Killed at any point, the next husk-cri records the same exit (recovery)."""
        from shim import ttrpc_wire as w
        shims = self.svc.need_shims()
        store = self.svc.store
        pid = _shim_pid(store, object_id)
        self._keep_pending(object_id, info)
        try:
            await shims.call(object_id, address, "Delete", timeout=30.0, id=object_id)
        except ShimGone:
            pass
        except w.TtrpcError as e:
            if e.code != w.NOT_FOUND:
                log.warning("deleting the exited task failed", extra={"id": object_id, "error": str(e)})
        self._record_exit(object_id, info)
        await shims.shutdown(object_id, address, pid, shared=shim_shared(store, address, object_id))
        log.info("task exited", extra={"id": object_id, "exit_code": info.exit_code, "reason": info.reason})

    def _keep_pending(self, object_id: str, info: ExitInfo) -> None:
        """The exit, written into the record before the task's Delete removes the shim's copy (state unchanged:
        RPCs see the task as before until the exit is recorded)."""
        store = self.svc.store
        rec = store.record(object_id)
        if rec is None:
            return
        doc = {"code": info.exit_code, "at": info.exited_at, "oom": info.oom, "message": info.message}
        if rec.extra.get(PENDING_EXIT) == doc:
            return
        new = dataclasses.replace(rec, extra={**rec.extra, PENDING_EXIT: doc})
        try:
            if isinstance(new, ContainerRecord):
                store.put_container(new)
            else:
                store.put_sandbox(new)
        except (sqlite3.Error, OSError) as e:
            # Only a safeguard against a kill in the next steps: the exit is still recorded after the Delete.
            log.warning("could not keep the exit as pending", extra={"id": object_id, "error": str(e)})

    def _record_exit(self, object_id: str, info: ExitInfo) -> None:
        store = self.svc.store
        c = store.container(object_id)
        if c is not None:
            extra = {k: v for k, v in c.extra.items() if k not in ("shim_pid", PENDING_EXIT)}
            store.put_container(dataclasses.replace(
                c, state=ContainerState.EXITED, exit_code=info.exit_code, finished_at=info.exited_at,
                reason=info.reason, message=info.message or c.message, shim_address="", extra=extra))
            if self._on_stopped is not None:
                self._on_stopped(object_id)
            return
        s = store.sandbox(object_id)
        if s is not None:
            extra = {k: v for k, v in s.extra.items() if k not in ("shim_pid", PENDING_EXIT)}
            extra["exit"] = {"code": info.exit_code, "at": info.exited_at, "reason": info.reason,
                             "message": info.message}
            state = SandboxState.NOTREADY if s.state == SandboxState.READY else s.state
            store.put_sandbox(dataclasses.replace(s, state=state, shim_address="", extra=extra))
            if self._on_stopped is not None:
                self._on_stopped(object_id)

    async def _kill_orphan(self, object_id: str) -> None:
        """The shim died without an exit record: the container may still run, unreachable. Remove it with
        the runtime (runc/husk `delete --force` kills it) so nothing is left behind unaccounted for."""
        store = self.svc.store
        rec = store.record(object_id)
        runtime = rec.extra.get("runtime", "") if rec is not None else ""
        await force_delete(self.svc, object_id, runtime)

    # --- signalling ----------------------------------------------------------------------------
    async def kill(self, object_id: str, sig: int, all_processes: bool = False) -> None:
        """Sends `sig` to the task; a task that already exited is fine."""
        from shim import ttrpc_wire as w
        address = self._address(object_id)
        if not address:
            return
        try:
            await self.svc.need_shims().call(object_id, address, "Kill", timeout=30.0, id=object_id,
                                             signal=sig, all=all_processes)
        except ShimGone:
            return
        except w.TtrpcError as e:
            if e.code in (w.NOT_FOUND, w.FAILED_PRECONDITION):
                return
            raise

    async def stop(self, object_id: str, sig: int, timeout: float) -> None:
        """`sig`, then SIGKILL after `timeout` seconds; returns once the exit is recorded."""
        if not self.watching(object_id):
            return
        if sig != signals.SIGKILL and timeout > 0:
            await self.kill(object_id, sig)
            if await self.wait_exit(object_id, timeout):
                return
            log.info("task did not stop in time; killing it", extra={"id": object_id, "timeout": timeout})
        await self.kill(object_id, signals.SIGKILL, all_processes=True)
        if not await self.wait_exit(object_id, 30.0):
            raise TimeoutError(f"{object_id} did not exit within 30s of SIGKILL")


def shim_shared(store: Any, address: str, object_id: str) -> bool:
    """Whether a record other than `object_id`'s still has a task in the shim at `address` (a pod's
    sandbox and containers share the sandbox's shim; a container being created names it before its Create
    is sent). Checked right after the caller's record changed, with no await in between: of two tasks
    ending together, the last to record its exit ends the shim."""
    if not address:
        return False
    for rec in store.all_records():
        if rec.id != object_id and rec.shim_address == address:
            return True
    return False


def drop_shim_reference(store: Any, object_id: str, address: str) -> bool:
    """`object_id`'s record stops naming the shim at `address` (its task there is gone, or was never made),
    and whether another record still names it; one step, no await, as the exit watcher records an exit."""
    if not address:
        return False
    rec = store.record(object_id)
    if rec is not None and rec.shim_address == address:
        extra = {k: v for k, v in rec.extra.items() if k != "shim_pid"}
        new = dataclasses.replace(rec, shim_address="", extra=extra)
        if isinstance(new, ContainerRecord):
            store.put_container(new)
        else:
            store.put_sandbox(new)
    return shim_shared(store, address, object_id)


async def release_shim(svc: "Services", object_id: str, address: str, shim_pid: int = 0) -> None:
    """Undo of a record that names a shim before its task is made there (CreateContainer): if the record
    still names it, it stops, and the shim ends unless another record names it. No task is touched."""
    rec = svc.store.record(object_id)
    if rec is None or rec.shim_address != address:
        return      # discard_task has released it already
    shared = drop_shim_reference(svc.store, object_id, address)
    await svc.need_shims().shutdown(object_id, address, shim_pid, shared=shared)


def _shim_pid(store: Any, object_id: str) -> int:
    rec = store.record(object_id)
    return int(rec.extra.get("shim_pid", 0)) if rec is not None else 0


async def force_delete(svc: "Services", object_id: str, runtime: str) -> None:
    """`<runtime> --root R delete --force ID` for a task whose shim is gone (best effort, logged)."""
    import os
    import sys
    if not runtime:
        return
    if runtime == "husk":
        binary = os.path.join(os.path.dirname(sys.executable), "husk")
        if not os.path.exists(binary):
            return
    else:
        binary = runtime
    shims = svc.need_shims()
    # The global flags the shim gave the runtime, as containerd's runc client passes them on every verb.
    driver = ["--systemd-cgroup"] if shims.systemd_cgroup else []
    try:
        proc = await asyncio.create_subprocess_exec(binary, "--root", shims.root_for(runtime), *driver, "delete",
                                                    "--force", object_id, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    except (OSError, asyncio.TimeoutError) as e:
        log.warning("force delete failed", extra={"id": object_id, "error": str(e)})
        return
    if proc.returncode != 0 and b"not exist" not in err and b"not found" not in err:
        log.warning("force delete failed", extra={"id": object_id, "error": err.decode(errors="replace")[-300:]})


async def discard_task(svc: "Services", object_id: str, address: str, runtime: str, shim_pid: int = 0,
                       shared: bool | None = None) -> None:
    """Undo of a half-made task: kill it, delete it, let its record stop naming the shim, end the shim
    (unless another record names it, or `shared` says another task of the caller's still will), and let
    the runtime forget it."""
    from shim import ttrpc_wire as w
    shims = svc.need_shims()
    if address:
        for method, fields in (("Kill", {"signal": signals.SIGKILL, "all": True}), ("Delete", {})):
            try:
                await shims.call(object_id, address, method, timeout=30.0, id=object_id, **fields)
            except ShimGone:
                break
            except w.TtrpcError as e:
                if e.code not in (w.NOT_FOUND, w.FAILED_PRECONDITION):
                    log.warning("discarding task: %s failed", method, extra={"id": object_id, "error": str(e)})
                if method == "Delete" and e.code == w.FAILED_PRECONDITION:
                    # Still running after SIGKILL: give the exit a moment to be reaped, then try again.
                    await asyncio.sleep(0.1)
                    try:
                        await shims.call(object_id, address, "Delete", timeout=30.0, id=object_id)
                    except (ShimGone, w.TtrpcError):
                        pass
    shared = drop_shim_reference(svc.store, object_id, address) or bool(shared)
    await shims.shutdown(object_id, address, shim_pid, shared=shared)
    await force_delete(svc, object_id, runtime)
