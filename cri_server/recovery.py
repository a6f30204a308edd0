"""What a starting husk-cri does with the state a previous one left: nothing is lost, nothing half-made stays.

Sandboxes and containers whose creation was cut short (state creating) are torn down. Then every record
that says its task lives (a ready sandbox, a created or running container) is reconciled with its shim,
as containerd's CRI plugin does on restart: the shim's State is the truth. created stays created; running
makes a record that still says created RUNNING (husk-cri died between the shim's Start and recording it);
stopped records the exit (code and time from the shim, or from its durable exit file when the shim is
gone); no task and no exit file records the exit the previous husk-cri's watcher had read and kept as pending
(it was killed between the task's Delete and recording the exit); with none of these it is EXITED with exit
code 255, reason Unknown (a sandbox: NotReady), and the runtime force-deletes what may still run. Reconciled
records are persisted before the gRPC server accepts calls; live tasks are watched again. A ready sandbox
whose network namespace vanished is NotReady.
A pod's tasks share the sandbox's shim (records made before that have a shim per container: both recover
the same way, each task asked at its record's address); a shim ends once no record's task is left in it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from cri_server.context import Services
from cri_server.network import netns
from cri_server.shims import ShimGone
from cri_server.store.records import ContainerRecord, ContainerState, SandboxRecord, SandboxState
from cri_server.tasks import PENDING_EXIT, REASON_UNKNOWN, SHIM_GONE_EXIT, ExitInfo, discard_task, pending_exit

log = logging.getLogger(__name__)

# TaskState.status values
CREATED, RUNNING, STOPPED, GONE, UNKNOWN = "created", "running", "stopped", "gone", "unknown"
STATE_TIMEOUT = 10.0    # s a shim has to answer State during recovery (all are asked at once)


@dataclass(frozen=True)
class TaskState:
    """What a shim says of its task's init process, or that no shim answers."""
    status: str             # created | running | stopped | gone (no shim, no exit file) | unknown (no answer)
    pid: int = 0
    exit_code: int = 0
    exited_at: int = 0      # ns since the epoch
    oom: bool = False
    detail: str = ""        # why gone / unknown


def reconcile_container(rec: ContainerRecord, task: TaskState, now: int, started_hint: int = 0) -> ContainerRecord:
    """The record `rec` (created or running, with a shim) made true to `task`. `started_hint`: when the
    runtime started the process, if known (0: unknown; a record found running then gets `now`, as
    containerd does). Pure: the caller persists and cleans up."""
    if task.status == UNKNOWN or rec.state not in (ContainerState.CREATED, ContainerState.RUNNING):
        return rec
    if task.status == CREATED:
        return rec
    if task.status == RUNNING:     # a pending exit read before is stale (a failed Wait): dropped
        started = rec.started_at or started_hint or now
        return dataclasses.replace(rec, state=ContainerState.RUNNING, started_at=started, pid=task.pid or rec.pid,
                                   extra={k: v for k, v in rec.extra.items() if k != PENDING_EXIT})
    extra = {k: v for k, v in rec.extra.items() if k not in ("shim_pid", PENDING_EXIT)}
    info = _known_exit(rec, task, now)
    if info is not None:
        started = rec.started_at or min(started_hint, info.exited_at)
        return dataclasses.replace(rec, state=ContainerState.EXITED, started_at=started,
                                   finished_at=info.exited_at, exit_code=info.exit_code, reason=info.reason,
                                   message=info.message or rec.message, shim_address="", extra=extra)
    # GONE
    message = f"the container's shim was gone when husk-cri restarted ({task.detail})" if task.detail else \
        "the container's shim was gone when husk-cri restarted"
    return dataclasses.replace(rec, state=ContainerState.EXITED, started_at=rec.started_at,
                               finished_at=now, exit_code=SHIM_GONE_EXIT, reason=REASON_UNKNOWN,
                               message=message, shim_address="", extra=extra)


def _known_exit(rec: ContainerRecord | SandboxRecord, task: TaskState, now: int) -> ExitInfo | None:
    """The exit of a stopped task (the shim's, or its exit file's); for a task gone without an exit file, the
    exit the previous husk-cri's watcher kept as pending in the record; else None."""
    if task.status == STOPPED:
        return ExitInfo(task.exit_code, task.exited_at or now, task.oom)
    if task.status == GONE:
        return pending_exit(rec)
    return None


def reconcile_sandbox(rec: SandboxRecord, task: TaskState, now: int) -> SandboxRecord:
    """A ready sandbox made true to its pause task: stopped or gone makes it NotReady with the exit."""
    if rec.state != SandboxState.READY or task.status not in (STOPPED, GONE):
        if task.status == RUNNING and PENDING_EXIT in rec.extra:   # stale (a failed Wait): dropped
            return dataclasses.replace(rec, extra={k: v for k, v in rec.extra.items() if k != PENDING_EXIT})
        return rec
    extra = {k: v for k, v in rec.extra.items() if k not in ("shim_pid", PENDING_EXIT)}
    info = _known_exit(rec, task, now)
    if info is None:
        info = ExitInfo(SHIM_GONE_EXIT, now, message=f"the sandbox's shim was gone when husk-cri restarted"
                                                     f"{f' ({task.detail})' if task.detail else ''}")
    extra["exit"] = {"code": info.exit_code, "at": info.exited_at, "reason": info.reason, "message": info.message}
    return dataclasses.replace(rec, state=SandboxState.NOTREADY, shim_address="", extra=extra)


async def query_task(svc: Services, object_id: str, address: str, timeout: float = STATE_TIMEOUT) -> TaskState:
    """The shim's State of the init of `object_id`; its durable exit file when the shim or task is gone."""
    from shim import ttrpc_wire as w
    from shim.pb.task_types import Status
    shims = svc.need_shims()
    try:
        r = await shims.call(object_id, address, "State", timeout=timeout, id=object_id)
    except ShimGone as e:
        return _from_exit_file(svc, object_id, str(e))
    except w.TtrpcError as e:
        if e.code == w.NOT_FOUND:
            return _from_exit_file(svc, object_id, e.message)
        return TaskState(UNKNOWN, detail=e.message)
    status = int(r.status)
    if status == Status.CREATED:
        return TaskState(CREATED, pid=int(r.pid))
    if status in (Status.RUNNING, Status.PAUSED, Status.PAUSING):
        return TaskState(RUNNING, pid=int(r.pid))
    if status == Status.STOPPED:
        ex = shims.exit_record(object_id)
        exited_at = int(r.exited_at.seconds) * 1_000_000_000 + int(r.exited_at.nanos) if r.exited_at else 0
        return TaskState(STOPPED, pid=int(r.pid), exit_code=int(r.exit_status),
                         exited_at=exited_at or (ex.exited_at_ns if ex else 0), oom=bool(ex and ex.oom_killed))
    return TaskState(UNKNOWN, detail=f"task status {status}")


def _from_exit_file(svc: Services, object_id: str, detail: str) -> TaskState:
    ex = svc.need_shims().exit_record(object_id)
    if ex is None:
        return TaskState(GONE, detail=detail)
    return TaskState(STOPPED, pid=ex.pid, exit_code=ex.exit_status, exited_at=ex.exited_at_ns, oom=ex.oom_killed)


def started_hint(svc: Services, rec: ContainerRecord, now: int) -> int:
    """When the runtime started the container, estimated from its state directory: `start` removes the exec
    fifo (runc; husk's start socket, exec.sock, likewise), so with it gone the directory's mtime is the start
    (or a later change of its entries). 0 when not known. Clamped to [created_at, now]."""
    d = os.path.join(svc.need_shims().root_for(rec.extra.get("runtime", "")), rec.id)
    try:
        if any(os.path.lexists(os.path.join(d, name)) for name in ("exec.fifo", "exec.sock")):
            return 0
        mtime = os.stat(d).st_mtime_ns
    except OSError:
        return 0
    return min(max(mtime, rec.created_at), now)


async def reconcile_container_now(svc: Services, rec: ContainerRecord) -> ContainerRecord:
    """Brings one live-looking container record in line with its shim (StartContainer finding the task
    not created). Persists a change; an exit is left to the task's watcher."""
    if not rec.shim_address:
        return rec
    task = await query_task(svc, rec.id, rec.shim_address)
    if task.status != RUNNING:
        return rec
    now = time.time_ns()
    new = reconcile_container(rec, task, now, started_hint(svc, rec, now))
    if new != rec:
        svc.store.put_container(new)
    return new


async def recover(svc: Services, *, remove_locked: Callable[[Services, str], Awaitable[Any]],
                  remove_sandbox_locked: Callable[[Services, str], Awaitable[Any]]) -> None:
    """remove_locked / remove_sandbox_locked remove a container / sandbox whose creation was interrupted
    (the RPC layer's removal, passed in so that this module does not import the RPC handlers)."""
    store = svc.store
    shims = svc.need_shims()
    tasks = svc.need_tasks()

    for c in [c for c in store.list_containers() if c.extra.get("creating")]:
        log.warning("removing a container whose creation was interrupted", extra={"id": c.id})
        # The record names the pod's shim before the Create is sent (records from before that do not: the
        # sandbox's then), so its task is found there even when the sandbox's exit was recorded meanwhile.
        sb = store.find_sandbox(c.sandbox_id)
        pod_shim = c.shim_address or (sb.shim_address if sb is not None else "")
        await _discard_by_socket(svc, c.id, c.extra.get("runtime", ""), pod_shim)
        async with svc.locks.hold(c.id):
            await remove_locked(svc, c.id)
    for s in [s for s in store.list_sandboxes() if s.state == SandboxState.CREATING]:
        log.warning("removing a pod sandbox whose creation was interrupted", extra={"id": s.id})
        await _discard_by_socket(svc, s.id, s.extra.get("runtime", ""))
        async with svc.locks.hold(s.id):
            await remove_sandbox_locked(svc, s.id)

    await _reconcile_all(svc)

    watched = 0
    for s in store.list_sandboxes():
        if s.shim_address:
            tasks.watch(s.id)
            watched += 1
        if s.state == SandboxState.READY and s.netns_path and not netns.is_pinned(s.netns_path):
            log.warning("the network namespace of a ready pod sandbox vanished; it is NotReady now",
                        extra={"id": s.id, "netns": s.netns_path})
            store.put_sandbox(dataclasses.replace(s, state=SandboxState.NOTREADY,
                                                  extra={**s.extra, "lost": "network namespace vanished"}))
    for c in store.list_containers():
        if c.shim_address and c.state in (ContainerState.CREATED, ContainerState.RUNNING):
            tasks.watch(c.id)
            watched += 1
    # Shims nobody refers to (husk-cri died between recording an exit and ending the shim).
    addresses = [r.shim_address for r in (*store.list_sandboxes(), *store.list_containers()) if r.shim_address]
    known = {s.id for s in store.list_sandboxes() if s.shim_address} | \
        {c.id for c in store.list_containers() if c.shim_address} | \
        {os.path.basename(d) for d in map(shims.shim_dir, addresses) if d}
    try:
        leftovers = [d for d in os.listdir(shims.base) if d not in known]
    except FileNotFoundError:
        leftovers = []
    for oid in leftovers:
        rec = store.find_container(oid) or store.find_sandbox(oid)
        log.info("ending a shim no record refers to", extra={"id": oid})
        await _discard_by_socket(svc, oid, rec.extra.get("runtime", "") if rec is not None else "")
    log.info("state recovered", extra={"sandboxes": len(store.list_sandboxes()),
                                       "containers": len(store.list_containers()), "watched": watched})


async def _reconcile_all(svc: Services) -> None:
    """Every ready sandbox and created/running container against its shim (all asked at once). A task
    found stopped or gone is recorded first, then deleted with its shim (killed before the cleanup ends,
    the next start finds a shim no record refers to and ends it)."""
    store = svc.store
    containers = [c for c in store.list_containers()
                  if c.shim_address and c.state in (ContainerState.CREATED, ContainerState.RUNNING)]
    sandboxes = [s for s in store.list_sandboxes() if s.shim_address and s.state == SandboxState.READY]
    objs: list[ContainerRecord | SandboxRecord] = [*containers, *sandboxes]
    states = await asyncio.gather(*(query_task(svc, o.id, o.shim_address) for o in objs))
    now = time.time_ns()
    ended: list[tuple[str, str, str, int]] = []
    changed: list[ContainerRecord | SandboxRecord] = []
    for old, task in zip(objs, states):
        new: ContainerRecord | SandboxRecord
        if isinstance(old, ContainerRecord):
            new = reconcile_container(old, task, now, started_hint(svc, old, now))
        else:
            new = reconcile_sandbox(old, task, now)
        if task.status == UNKNOWN:
            log.warning("the shim did not tell its task's state; watching it as recorded",
                        extra={"id": old.id, "error": task.detail})
        if new == old:
            continue
        log.warning("record reconciled with the shim", extra={"id": old.id, "was": old.state.value,
                                                              "now": new.state.value, "task": task.status,
                                                              "detail": task.detail})
        changed.append(new)
        if not new.shim_address:
            ended.append((old.id, old.shim_address, old.extra.get("runtime", ""), int(old.extra.get("shim_pid", 0))))
    if changed:
        with store.transaction() as tx:     # one commit (one fsync) for them all
            for new in changed:
                if isinstance(new, ContainerRecord):
                    tx.put_container(new)
                else:
                    tx.put_sandbox(new)
    for i, (oid, address, runtime, shim_pid) in enumerate(ended):
        # Deletes the stopped task and ends its shim; a gone shim's container may still run: the runtime
        # force-deletes (kills) it, so nothing runs unaccounted for. The records of a pod's ended tasks were all
        # cleared above: the pod's shim stays for its later tasks here (it refuses to end while it serves
        # one, and waiting for it to go cost 5 s per task) and ends with the last.
        later = any(a == address for _, a, _, _ in ended[i + 1:])
        await discard_task(svc, oid, address, runtime, shim_pid, shared=later or None)


async def _discard_by_socket(svc: Services, object_id: str, runtime: str, pod_shim: str = "") -> None:
    """A half-made object's task and shim, if it got as far as making them: its own shim (a sandbox, or a
    container from before shims were grouped: the socket path is fixed by its id), else its task in the pod's
    shim at `pod_shim` (a container; NotFound there is fine, the shim stays for the pod)."""
    shims = svc.need_shims()
    sock = shims.paths(object_id).socket
    if os.path.exists(sock):
        await discard_task(svc, object_id, f"unix://{sock}", runtime)
    elif pod_shim:
        await discard_task(svc, object_id, pod_shim, runtime)
    else:
        await shims.shutdown(object_id, "")
