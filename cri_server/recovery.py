"""What a starting husk-cri does with the state a previous one left: nothing is lost, nothing half-made stays.

Sandboxes and containers whose creation was cut short (state creating) are torn down. Every task with a
shim address is watched again: a live shim answers Wait when its task exits (at once if it exited while
husk-cri was away); a dead shim's durable exit file gives the status. A ready sandbox whose network
namespace vanished is reported NotReady. Runs before the gRPC server accepts calls.
"""
from __future__ import annotations

import dataclasses
import logging
import os

from cri_server.context import Services
from cri_server.network import netns
from cri_server.store.records import ContainerState, SandboxState
from cri_server.tasks import discard_task

log = logging.getLogger(__name__)


async def recover(svc: Services) -> None:
    store = svc.store
    shims = svc.need_shims()
    tasks = svc.need_tasks()
    from cri_server.rpc.container_lifecycle import remove_locked
    from cri_server.rpc.sandbox_stop import remove_sandbox_locked

    for c in [c for c in store.list_containers() if c.extra.get("creating")]:
        log.warning("removing a container whose creation was interrupted", extra={"id": c.id})
        await _discard_by_socket(svc, c.id, c.extra.get("runtime", ""))
        async with svc.locks.hold(c.id):
            await remove_locked(svc, c.id)
    for s in [s for s in store.list_sandboxes() if s.state == SandboxState.CREATING]:
        log.warning("removing a pod sandbox whose creation was interrupted", extra={"id": s.id})
        await _discard_by_socket(svc, s.id, s.extra.get("runtime", ""))
        async with svc.locks.hold(s.id):
            await remove_sandbox_locked(svc, s.id)

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
    known = {s.id for s in store.list_sandboxes() if s.shim_address} | \
        {c.id for c in store.list_containers() if c.shim_address}
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


async def _discard_by_socket(svc: Services, object_id: str, runtime: str) -> None:
    """A half-made object's shim, if it got as far as starting one (its socket path is fixed by its id)."""
    shims = svc.need_shims()
    sock = shims.paths(object_id).socket
    if os.path.exists(sock):
        await discard_task(svc, object_id, f"unix://{sock}", runtime)
    else:
        await shims.shutdown(object_id, "")
