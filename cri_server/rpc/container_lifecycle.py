"""StartContainer, StopContainer and RemoveContainer.

Start runs the created task (a task the shim says is past created, started by a Start whose husk-cri died,
is recorded as it is and answered FAILED_PRECONDITION, never killed); Stop sends the stop signal (the
request's, else the image's, else SIGTERM) and SIGKILL after the timeout, returning once the exit is
recorded; Remove force-stops, then deletes the task, the shim, the rootfs snapshot, the bundle and the
record. Stop and Remove of an unknown id succeed (kubelet retries them).
"""
from __future__ import annotations

import dataclasses
import logging
import signal as signals
import time

from cri_server import fsutil, trace
from cri_server.api.v1 import api_pb2 as pb
from cri_server.context import Services
from cri_server.errors import FailedPrecondition, Internal
from cri_server.images.errors import ImageError
from cri_server.rpc import events
from cri_server.store.records import ContainerRecord, ContainerState
from cri_server.tasks import discard_task
from runtime import signals as signames

log = logging.getLogger(__name__)


async def start_container(svc: Services, req: pb.StartContainerRequest) -> pb.StartContainerResponse:
    """StartContainer starts a created container; it is RUNNING (or already exited) when this returns."""
    from shim import ttrpc_wire as w
    from cri_server.shims import ShimGone
    rec = svc.store.get_container(req.container_id)
    async with svc.locks.hold(rec.id):
        rec = svc.store.get_container(rec.id)
        if rec.extra.get("creating"):
            raise FailedPrecondition(f"container {rec.id} is still being created")
        if rec.state != ContainerState.CREATED:
            raise FailedPrecondition(f"container {rec.id} is {rec.state.value}, not created")
        sb = svc.store.find_sandbox(rec.sandbox_id)
        if sb is None or sb.state.value != "ready":
            raise FailedPrecondition(f"the pod sandbox of container {rec.id} is not ready")
        started = time.time_ns()
        tr = trace.resume(rec.extra, "container", rec.id, f"{sb.pod_namespace}/{sb.pod_name}/{rec.container_name}",
                          svc.config.trace.slow_step_seconds)
        try:
            with tr.step("runtime_start"):
                await svc.need_shims().call(rec.id, rec.shim_address, "Start", id=rec.id)
        except (w.TtrpcError, ShimGone) as e:
            message = e.message if isinstance(e, w.TtrpcError) else str(e)
            if isinstance(e, w.TtrpcError) and e.code == w.FAILED_PRECONDITION:
                # The shim's task is past created (started by a Start whose husk-cri died before recording
                # it): the record is made true, the task left alone, and the answer names its state.
                from cri_server.recovery import reconcile_container_now
                cur = await reconcile_container_now(svc, rec)
                if cur.state != ContainerState.CREATED:
                    raise FailedPrecondition(f"container {rec.id} is {cur.state.value}, not created")
                raise FailedPrecondition(f"container {rec.id} cannot be started: {message}")
            await svc.need_tasks().stop(rec.id, signals.SIGKILL, 0)
            cur = svc.store.get_container(rec.id)
            svc.store.put_container(dataclasses.replace(cur, state=ContainerState.EXITED, exit_code=128,
                                                        reason="StartError", message=message,
                                                        finished_at=cur.finished_at or time.time_ns(),
                                                        extra=trace.with_trace(cur.extra, tr)))
            raise Internal(f"start container {rec.id}: {message}") from None
        cur = svc.store.get_container(rec.id)
        if cur.state == ContainerState.CREATED:
            cur = dataclasses.replace(cur, state=ContainerState.RUNNING, started_at=started)
        else:
            # It already exited (and the exit was recorded) before the Start reply arrived.
            cur = dataclasses.replace(cur, started_at=min(started, cur.finished_at or started))
        cur = dataclasses.replace(cur, extra=trace.with_trace(cur.extra, tr))
        svc.store.put_container(cur)
        events.publish_container(svc, rec.id, "started")
    return pb.StartContainerResponse()


def stop_signal(svc: Services, rec: ContainerRecord) -> int:
    config = pb.ContainerConfig.FromString(rec.config) if rec.config else pb.ContainerConfig()
    for name in (pb.Signal.Name(config.stop_signal) if config.stop_signal else "",
                 rec.extra.get("image_stop_signal", ""), svc.config.runtime.default_stop_signal):
        if name:
            try:
                return signames.parse(name)
            except ValueError:
                log.warning("unusable stop signal %r; trying the next", name, extra={"id": rec.id})
    return int(signals.SIGTERM)


async def stop_container(svc: Services, req: pb.StopContainerRequest) -> pb.StopContainerResponse:
    """StopContainer stops a running container with a grace period (timeout, seconds); idempotent."""
    rec = svc.store.find_container(req.container_id)
    if rec is None:
        return pb.StopContainerResponse()
    async with svc.locks.hold(rec.id):
        await stop_locked(svc, rec.id, stop_signal(svc, rec), max(req.timeout, 0))
    return pb.StopContainerResponse()


async def stop_locked(svc: Services, container_id: str, sig: int, timeout: float) -> None:
    try:
        await svc.need_tasks().stop(container_id, sig, timeout)
    except TimeoutError as e:
        raise Internal(f"stop container {container_id}: {e}") from None


async def remove_container(svc: Services, req: pb.RemoveContainerRequest) -> pb.RemoveContainerResponse:
    """RemoveContainer removes a container, stopping it first if it runs; idempotent."""
    rec = svc.store.find_container(req.container_id)
    if rec is None:
        return pb.RemoveContainerResponse()
    async with svc.locks.hold(rec.id):
        await remove_locked(svc, rec.id)
    return pb.RemoveContainerResponse()


async def remove_locked(svc: Services, container_id: str) -> None:
    """Everything a container has, gone: its task and shim, rootfs, bundle, dir and record."""
    rec = svc.store.find_container(container_id)
    if rec is None:
        return
    await stop_locked(svc, rec.id, signals.SIGKILL, 0)
    rec = svc.store.get_container(rec.id)
    if rec.shim_address:
        # Never watched (a failed restart) or its watcher is gone: discard the task directly.
        await discard_task(svc, rec.id, rec.shim_address, rec.extra.get("runtime", ""),
                           int(rec.extra.get("shim_pid", 0)))
    bundle = rec.extra.get("bundle") or svc.bundle_dir(rec.id)
    try:
        fsutil.remove_tree(bundle)
        if svc.images is not None:
            await svc.images.remove_snapshot(rec.id)
        fsutil.remove_tree(svc.container_dir(rec.id))
    except (OSError, ImageError) as e:
        raise Internal(f"remove container {rec.id}: {e}") from None
    svc.store.delete_container(rec.id)
    events.publish_container(svc, rec.id, "deleted", rec.sandbox_id)
    log.info("container removed", extra={"id": rec.id})
