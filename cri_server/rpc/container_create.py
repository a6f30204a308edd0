"""CreateContainer: a container in a ready sandbox, created but not started.

The image must be present (kubelet pulls first; a missing one is NotFound, its ErrImageNeverPull path). With
an undo for each step: reserve the name and write the record ahead (naming the pod's shim), the container's
dir and log file's parent, the rootfs snapshot mounted in the bundle, config.json from the spec builder (the
CRI config merged with the image config), task Create with the CRI log path (the shim writes the log itself)
in the pod's shim: the sandbox's shim serves the pod's containers too (containerd's grouping), so no process
is started.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time

from cri_server import fsutil, podfiles, trace
from cri_server.api.v1 import api_pb2 as pb
from cri_server.context import Services
from cri_server.errors import CriError, FailedPrecondition, Internal, InvalidArgument, NotFound
from cri_server.rpc.bundle import prepare_rootfs
from cri_server.rpc import events, listing
from cri_server.rpc.sandbox_run import _oci_config, new_id
from cri_server.spec.builder import container_spec
from cri_server.spec.context import ContainerContext, ImageConfig, SandboxInfo
from cri_server.store.records import ContainerRecord, ContainerState, SandboxRecord, SandboxState
from cri_server.store.store import container_name
from cri_server.tasks import discard_task, release_shim
from cri_server.undo import Undo
from cri_server.validation import check_request

log = logging.getLogger(__name__)


def validate(req: pb.CreateContainerRequest) -> None:
    c = req.config
    if not req.pod_sandbox_id:
        raise InvalidArgument("pod_sandbox_id: must not be empty")
    if not c.HasField("metadata") or not c.metadata.name:
        raise InvalidArgument("config.metadata.name: must not be empty")
    if not c.image.image:
        raise InvalidArgument("config.image.image: must not be empty")


def log_file(sandbox_config: pb.PodSandboxConfig, log_path: str) -> str:
    """The container's log file: the sandbox's log directory + the container's relative log path. An
    empty directory or path means no log; a path that would leave the directory is refused."""
    if not sandbox_config.log_directory or not log_path:
        return ""
    if log_path.startswith("/"):
        raise InvalidArgument(f"config.log_path: {log_path!r} must be relative to the sandbox log directory")
    directory = os.path.normpath(sandbox_config.log_directory)
    full = os.path.normpath(os.path.join(directory, log_path))
    if not full.startswith(directory + "/"):
        raise InvalidArgument(f"config.log_path: {log_path!r} leaves the sandbox log directory {directory}")
    return full


def sandbox_info(sb: SandboxRecord) -> SandboxInfo:
    x = sb.extra
    return SandboxInfo(id=sb.id, pid=sb.pid, netns_path=sb.netns_path, hostname=x.get("hostname", ""),
                       hosts_path=x.get("hosts_path", ""), resolv_path=x.get("resolv_path", ""),
                       hostname_path=x.get("hostname_path", ""), shm_path=x.get("shm_path", ""),
                       cgroup_parent=sb.cgroup_parent)


def _target_pid(svc: Services, sb: SandboxRecord, config: pb.ContainerConfig) -> int:
    ns = config.linux.security_context.namespace_options
    if ns.pid != pb.TARGET or not ns.target_id:
        return 0
    target = svc.store.find_container(ns.target_id)
    if target is None or target.sandbox_id != sb.id:
        raise NotFound(f"config.linux.security_context.namespace_options.target_id: container {ns.target_id!r} "
                       "not found in this pod")
    return target.pid if target.state == ContainerState.RUNNING else 0


async def create_container(svc: Services, req: pb.CreateContainerRequest) -> pb.CreateContainerResponse:
    """CreateContainer creates a new container in the given pod sandbox; StartContainer starts it."""
    check_request(req)
    validate(req)
    listing.check_container_room(svc, req)
    images = svc.need_images()
    sb = svc.store.get_sandbox(req.pod_sandbox_id)
    async with svc.locks.hold(sb.id):
        sb = svc.store.get_sandbox(sb.id)
        if sb.state != SandboxState.READY:
            raise FailedPrecondition(f"pod sandbox {sb.id} is not ready")
        cid = new_id()
        tr = trace.Trace("container", cid, f"{sb.pod_namespace}/{sb.pod_name}/{req.config.metadata.name}",
                         svc.config.trace.slow_step_seconds)
        try:
            with tr.step("image"):
                image = images.get(req.config.image.image)
                if image is None:
                    raise NotFound(f"image {req.config.image.image!r} not found: pull it first")
            name = container_name(req.config.metadata.name, sb, req.config.metadata.attempt)
            with tr.step("reserve_name"):
                svc.store.reserve_container_name(name, cid)
        except CriError:
            trace.save_failed(svc.store, tr)
            raise
        undo = Undo(cid)
        undo.push("release the name", svc.store.release_container_name, name, cid)
        try:
            async with svc.locks.hold(cid):
                await _create(svc, req, sb, image, cid, name, undo, tr)
            undo.discard()
        except BaseException as e:
            if not isinstance(e, (CriError, asyncio.CancelledError)):
                log.exception("CreateContainer failed", extra={"id": cid})
            await undo.run()
            tr.failed_with(e)
            trace.save_failed(svc.store, tr)
            raise
    return pb.CreateContainerResponse(container_id=cid)


async def _create(svc: Services, req: pb.CreateContainerRequest, sb: SandboxRecord, image: object, cid: str,
                  name: str, undo: Undo, tr: trace.Trace) -> None:
    from shim import ttrpc_wire as w
    config = req.config
    store = svc.store
    shims = svc.need_shims()
    images = svc.need_images()
    host = svc.host
    if host is None:
        raise FailedPrecondition("host information was not detected")
    sandbox_config = pb.PodSandboxConfig.FromString(sb.config)
    log_path = log_file(sandbox_config, config.log_path)
    runtime = sb.extra.get("runtime") or svc.runtime_for(sb.runtime_handler)
    cdir, bundle = svc.container_dir(cid), svc.bundle_dir(cid)
    stop_signal = image.config.stop_signal  # type: ignore[attr-defined]
    # The pod's shim (the sandbox's) is named in the record before anything else, read and written with no
    # await between: the sandbox's exit watcher then leaves the shim to this create (it would ask it to end
    # while the Create is in it), and whichever of the two lets go of it last ends it (tasks.shim_shared).
    current = store.get_sandbox(sb.id)
    address, shim_pid = current.shim_address, int(current.extra.get("shim_pid", 0))
    if not address:
        raise FailedPrecondition(f"pod sandbox {sb.id} has no running shim (its pause container exited)")
    rec = ContainerRecord(
        id=cid, sandbox_id=sb.id, name=name, container_name=config.metadata.name,
        attempt=config.metadata.attempt, state=ContainerState.CREATED, created_at=time.time_ns(),
        image=config.image.image, image_ref=image.id, image_id=image.id,  # type: ignore[attr-defined]
        labels=dict(config.labels), annotations=dict(config.annotations), config=config.SerializeToString(),
        log_path=log_path, shim_address=address,
        extra={"creating": True, "runtime": runtime, "bundle": bundle, "image_stop_signal": stop_signal,
               "tty": bool(config.tty), "stdin": bool(config.stdin), "stdin_once": bool(config.stdin_once),
               "shim_pid": shim_pid})
    with tr.step("record"):
        store.put_container(rec)
    undo.push("delete the record", store.delete_container, cid)
    undo.push("release the pod's shim", release_shim, svc, cid, address, shim_pid)

    os.makedirs(cdir, mode=0o711, exist_ok=True)
    undo.push("remove the container dir", fsutil.remove_tree, cdir)
    if log_path:
        os.makedirs(os.path.dirname(log_path), mode=0o755, exist_ok=True)

    with tr.step("rootfs"):
        rootfs = await prepare_rootfs(images, undo, bundle, cid, image.id,  # type: ignore[attr-defined]
                                      f"container rootfs from {config.image.image}")

    with tr.step("spec"):
        ctx = ContainerContext(id=cid, config=config, sandbox_config=sandbox_config, sandbox=sandbox_info(sb),
                               image=ImageConfig.from_oci(_oci_config(image)), rootfs=rootfs, container_dir=cdir,
                               host=host, target_pid=_target_pid(svc, sb, config), image_name=config.image.image)
        spec = container_spec(ctx)
        podfiles.write_atomic(os.path.join(bundle, "config.json"), json.dumps(spec))

    # Read again: the pause may have exited while the rootfs was made (the shim stays while we name it).
    if store.get_sandbox(sb.id).shim_address != address:
        raise FailedPrecondition(f"pod sandbox {sb.id} has no running shim (its pause container exited)")
    undo.push("discard the task", discard_task, svc, cid, address, runtime, shim_pid)
    opts = shims.create_options(log_path=log_path, stdin_once=bool(config.stdin_once),
                                state_dir=shims.task_dir(cid))
    with tr.step("runtime_create"):
        trace.request_runtime_stages(bundle)
        try:
            # Output always goes through pipes the shim reads: into the log (when there is one) and to attached
            # clients (kubectl attach), even when the container has no log path.
            created = await shims.call(cid, address, "Create", id=cid, bundle=bundle, terminal=bool(config.tty),
                                       stdin="attach:" if config.stdin else "", stdout="attach:",
                                       stderr="" if config.tty else "attach:",
                                       options=opts)
        except w.TtrpcError as e:
            raise Internal(f"create container {config.metadata.name}: {e.message}") from None
        finally:
            trace.add_runtime_stages(tr, bundle)
    extra = {k: v for k, v in rec.extra.items() if k != "creating"}
    extra[trace.KEY] = tr.to_json()
    store.put_container(dataclasses.replace(rec, pid=int(created.pid), extra=extra))
    svc.need_tasks().watch(cid)
    events.publish_container(svc, cid, "created")
    log.info("container created", extra={"id": cid, "sandbox": sb.id, "container": config.metadata.name})
