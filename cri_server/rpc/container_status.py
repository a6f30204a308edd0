"""ContainerStatus and ListContainers, answered from the in-memory index.

Never touches a shim: exits are recorded by the event path (phase 2) as they happen.
"""
from __future__ import annotations

import json

from cri_server.api.v1 import api_pb2 as pb
from cri_server.context import Services
from cri_server.store.records import ContainerFilter, ContainerRecord, ContainerState

_STATE_TO_PB = {ContainerState.CREATED: pb.CONTAINER_CREATED, ContainerState.RUNNING: pb.CONTAINER_RUNNING,
                ContainerState.EXITED: pb.CONTAINER_EXITED, ContainerState.UNKNOWN: pb.CONTAINER_UNKNOWN}
_PB_TO_STATE = {v: k for k, v in _STATE_TO_PB.items()}


def to_container(r: ContainerRecord) -> pb.Container:
    return pb.Container(id=r.id, pod_sandbox_id=r.sandbox_id,
                        metadata=pb.ContainerMetadata(name=r.container_name, attempt=r.attempt),
                        image=pb.ImageSpec(image=r.image), image_ref=r.image_ref, image_id=r.image_id,
                        state=_STATE_TO_PB[r.state], created_at=r.created_at,
                        labels=r.labels, annotations=r.annotations)


def to_status(r: ContainerRecord) -> pb.ContainerStatus:
    config = pb.ContainerConfig.FromString(r.config) if r.config else pb.ContainerConfig()
    return pb.ContainerStatus(
        id=r.id, metadata=pb.ContainerMetadata(name=r.container_name, attempt=r.attempt),
        state=_STATE_TO_PB[r.state], created_at=r.created_at, started_at=r.started_at,
        finished_at=r.finished_at, exit_code=r.exit_code,
        image=pb.ImageSpec(image=r.image, annotations=config.image.annotations,
                           user_specified_image=config.image.user_specified_image),
        image_ref=r.image_ref, image_id=r.image_id, reason=r.reason, message=r.message,
        labels=r.labels, annotations=r.annotations, mounts=config.mounts, log_path=r.log_path,
        resources=pb.ContainerResources(linux=config.linux.resources) if config.linux.HasField("resources")
        else None,
        stop_signal=config.stop_signal)


def filter_from_pb(f: pb.ContainerFilter) -> ContainerFilter:
    state = _PB_TO_STATE[f.state.state] if f.HasField("state") else None
    return ContainerFilter(id=f.id, state=state, sandbox_id=f.pod_sandbox_id, label_selector=dict(f.label_selector))


async def container_status(svc: Services, req: pb.ContainerStatusRequest) -> pb.ContainerStatusResponse:
    """ContainerStatus returns state, times, exit code and reason, image, mounts and log path; NotFound for an
    unknown id. `verbose` adds pid and shim address as JSON under "info"."""
    r = svc.store.get_container(req.container_id)
    resp = pb.ContainerStatusResponse(status=to_status(r))
    if req.verbose:
        resp.info["info"] = json.dumps({"pid": r.pid, "sandboxID": r.sandbox_id, "shimAddress": r.shim_address,
                                        **dict(r.extra)})
    return resp


async def list_containers(svc: Services, req: pb.ListContainersRequest) -> pb.ListContainersResponse:
    """ListContainers returns the containers matching every set filter field (id, state, sandbox, labels)."""
    flt = filter_from_pb(req.filter) if req.HasField("filter") else ContainerFilter()
    return pb.ListContainersResponse(containers=[to_container(r) for r in svc.store.list_containers(flt)
                                                 if not r.extra.get("creating")])
