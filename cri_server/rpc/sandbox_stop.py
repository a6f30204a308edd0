"""StopPodSandbox and RemovePodSandbox.

Stop kills every container of the pod and the pause container, tears the network down (CNI DEL, then the
pinned namespace goes) and leaves the sandbox NotReady; Remove also removes the containers, the rootfs,
the pod's files and the record. Both are idempotent, and an unknown id is success (kubelet retries them).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal as signals

from cri_server import fsutil
from cri_server.api.v1 import api_pb2 as pb
from cri_server.context import Services
from cri_server.errors import Internal
from cri_server.images.errors import ImageError
from cri_server.network import netns
from cri_server.network.cni import CniError
from cri_server.rpc import events
from cri_server.rpc.container_lifecycle import remove_locked, stop_locked
from cri_server.rpc.sandbox_run import attachment
from cri_server.store.records import SandboxState
from cri_server.tasks import discard_task

log = logging.getLogger(__name__)


async def stop_pod_sandbox(svc: Services, req: pb.StopPodSandboxRequest) -> pb.StopPodSandboxResponse:
    """StopPodSandbox stops the sandbox and its containers and reclaims the network; idempotent."""
    rec = svc.store.find_sandbox(req.pod_sandbox_id)
    if rec is None:
        return pb.StopPodSandboxResponse()
    async with svc.locks.hold(rec.id):
        await stop_sandbox_locked(svc, rec.id)
    return pb.StopPodSandboxResponse()


async def _stop_one_container(svc: Services, cid: str) -> None:
    async with svc.locks.hold(cid):
        await stop_locked(svc, cid, signals.SIGKILL, 0)


async def stop_sandbox_locked(svc: Services, sandbox_id: str) -> None:
    rec = svc.store.get_sandbox(sandbox_id)
    # Containers first (they live in the pause container's namespaces), all at once.
    results = await asyncio.gather(*(_stop_one_container(svc, c.id) for c in svc.store.containers_of(rec.id)),
                                   return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    tasks = svc.need_tasks()
    try:
        await tasks.stop(rec.id, signals.SIGKILL, 0)
    except TimeoutError as e:
        raise Internal(f"stop pod sandbox {rec.id}: {e}") from None
    rec = svc.store.get_sandbox(rec.id)
    if rec.shim_address:    # discard_task clears the record's shim_address
        await discard_task(svc, rec.id, rec.shim_address, rec.extra.get("runtime", ""),
                           int(rec.extra.get("shim_pid", 0)))
    await teardown_network(svc, rec.id)
    rec = svc.store.get_sandbox(rec.id)
    if rec.state != SandboxState.NOTREADY:
        svc.store.put_sandbox(dataclasses.replace(rec, state=SandboxState.NOTREADY))
    log.info("pod sandbox stopped", extra={"id": rec.id})


async def teardown_network(svc: Services, sandbox_id: str) -> None:
    """CNI DEL (with the cached ADD result) and removal of the pinned namespace, once."""
    rec = svc.store.get_sandbox(sandbox_id)
    if not rec.netns_path or rec.extra.get("network_down"):
        return
    config = pb.PodSandboxConfig.FromString(rec.config)
    att = attachment(svc, rec, config)
    if netns.is_pinned(rec.netns_path):
        try:
            await svc.cni.delete(att)
        except CniError as e:
            raise Internal(f"tear down the network of pod sandbox {rec.id}: {e}") from None
    else:
        # The namespace is gone (e.g. a reboot): plugins cannot enter it, but IPAM must still release the
        # address; CNI DEL with an empty netns is how libcni does that.
        try:
            await svc.cni.delete(dataclasses.replace(att, netns_path=""))
        except CniError as e:
            log.warning("CNI DEL without a namespace failed", extra={"id": rec.id, "error": str(e)})
    try:
        netns.remove(rec.netns_path)
    except OSError as e:
        raise Internal(f"remove the network namespace of pod sandbox {rec.id}: {e}") from None
    rec = svc.store.get_sandbox(sandbox_id)
    svc.store.put_sandbox(dataclasses.replace(rec, extra={**rec.extra, "network_down": True}))


async def remove_pod_sandbox(svc: Services, req: pb.RemovePodSandboxRequest) -> pb.RemovePodSandboxResponse:
    """RemovePodSandbox removes the sandbox, stopping it and removing its containers first; idempotent."""
    rec = svc.store.find_sandbox(req.pod_sandbox_id)
    if rec is None:
        return pb.RemovePodSandboxResponse()
    async with svc.locks.hold(rec.id):
        await remove_sandbox_locked(svc, rec.id)
    return pb.RemovePodSandboxResponse()


async def remove_sandbox_locked(svc: Services, sandbox_id: str) -> None:
    rec = svc.store.find_sandbox(sandbox_id)
    if rec is None:
        return
    await stop_sandbox_locked(svc, rec.id)
    for c in svc.store.containers_of(rec.id):
        async with svc.locks.hold(c.id):
            await remove_locked(svc, c.id)
    rec = svc.store.get_sandbox(rec.id)
    try:
        for d in (rec.extra.get("bundle") or svc.bundle_dir(rec.id), svc.pod_state_dir(rec.id),
                  rec.pod_dir or svc.pod_dir(rec.id)):
            fsutil.remove_tree(d)
        if svc.images is not None:
            await svc.images.remove_snapshot(rec.id)
    except (OSError, ImageError) as e:
        raise Internal(f"remove pod sandbox {rec.id}: {e}") from None
    svc.store.delete_sandbox(rec.id)
    events.publish_container(svc, rec.id, "deleted", rec.id)
    log.info("pod sandbox removed", extra={"id": rec.id})
