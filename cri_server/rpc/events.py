"""GetContainerEvents: a server stream of container lifecycle events (kubelet's evented PLEG).

Every event carries the pod's sandbox status and the statuses of all its containers at that moment, as
kubelet expects, so it can update the pod without a relist. Lifecycle code calls publish_*.
"""
from __future__ import annotations

import time
from typing import AsyncIterator

from cri_server.api.v1 import api_pb2 as pb
from cri_server.context import Services
from cri_server.rpc import container_status, sandbox_status

_TYPES = {"created": pb.CONTAINER_CREATED_EVENT, "started": pb.CONTAINER_STARTED_EVENT,
          "stopped": pb.CONTAINER_STOPPED_EVENT, "deleted": pb.CONTAINER_DELETED_EVENT}


def _event(svc: Services, object_id: str, sandbox_id: str, kind: str) -> pb.ContainerEventResponse:
    ev = pb.ContainerEventResponse(container_id=object_id, container_event_type=_TYPES[kind],
                                   created_at=time.time_ns())
    sb = svc.store.sandbox(sandbox_id)
    if sb is not None:
        ev.pod_sandbox_status.CopyFrom(sandbox_status.to_status(sb))
        default = svc.config.runtime.default_stop_signal
        ev.containers_statuses.extend(container_status.to_status(c, default)
                                      for c in svc.store.containers_of(sandbox_id) if not c.extra.get("creating"))
    return ev


def publish_container(svc: Services, container_id: str, kind: str, sandbox_id: str = "") -> None:
    if not len(svc.events):
        return
    c = svc.store.container(container_id)
    svc.events.publish(_event(svc, container_id, sandbox_id or (c.sandbox_id if c else ""), kind))


def publish_sandbox(svc: Services, sandbox_id: str, kind: str) -> None:
    if len(svc.events):
        svc.events.publish(_event(svc, sandbox_id, sandbox_id, kind))


def publish_stopped(svc: Services, object_id: str) -> None:
    """The STOPPED event of a container or sandbox whose task exit was just recorded (the task monitor's
    on_stopped callback)."""
    if svc.store.container(object_id) is not None:
        publish_container(svc, object_id, "stopped")
    else:
        publish_sandbox(svc, object_id, "stopped")


async def get_container_events(svc: Services, req: pb.GetEventsRequest) -> AsyncIterator[pb.ContainerEventResponse]:
    """GetContainerEvents streams CREATED, STARTED, STOPPED and DELETED events of containers and sandboxes
    from the moment of the call on, until the client goes away."""
    async for ev in svc.events.subscribe():
        yield ev
