"""ContainerStatus and ListContainers, answered from the in-memory index.

Never touches a shim: exits are recorded by the event path (`tasks.py`) as they happen.
"""
from __future__ import annotations

import json

from cri_server import trace
from cri_server.api.v1 import api_pb2 as pb
from cri_server.context import Services
from cri_server.rpc.listing import EncodedItems
from cri_server.store.records import ContainerFilter, ContainerRecord, ContainerState
from runtime import signals as signames

_STATE_TO_PB = {ContainerState.CREATED: pb.CONTAINER_CREATED, ContainerState.RUNNING: pb.CONTAINER_RUNNING,
                ContainerState.EXITED: pb.CONTAINER_EXITED, ContainerState.UNKNOWN: pb.CONTAINER_UNKNOWN}
_PB_TO_STATE = {v: k for k, v in _STATE_TO_PB.items()}


def _signal_numbers() -> dict[int, int]:
    out: dict[int, int] = {}
    for name, value in pb.Signal.items():
        if value != pb.RUNTIME_DEFAULT:
            out.setdefault(signames.parse(name), value)   # enum order: SIGABRT before its alias SIGIOT
    return out


_SIGNAL_BY_NUMBER = _signal_numbers()


def cri_signal(name: str) -> int:
    """The CRI Signal of a signal name as an image config or the config file spells it; RUNTIME_DEFAULT when it is
    no signal. Names map as containerd's toCRISignal maps them ("SIGRTMIN+3" is SIGRTMINPLUS3); the forms only
    husk-cri's stop path accepts ("USR1", "10") map to the signal that is sent."""
    key = name.strip().upper().replace("+", "PLUS", 1).replace("-", "MINUS", 1)
    if key in pb.Signal.keys():
        return pb.Signal.Value(key)
    try:
        return _SIGNAL_BY_NUMBER.get(signames.parse(name), pb.RUNTIME_DEFAULT)
    except ValueError:
        return pb.RUNTIME_DEFAULT


def reported_stop_signal(config: pb.ContainerConfig, image_signal: str, default: str) -> int:
    """What ContainerStatus.stop_signal says, as containerd 2.x fills it: the request's, else the image's
    StopSignal, else the default (SIGTERM unless runtime.default_stop_signal says otherwise). The same order
    StopContainer uses, so the status names the signal a stop sends."""
    if config.stop_signal != pb.RUNTIME_DEFAULT:
        return config.stop_signal
    for name in (image_signal, default):
        if name and (sig := cri_signal(name)) != pb.RUNTIME_DEFAULT:
            return sig
    return pb.SIGTERM


def to_container(r: ContainerRecord) -> pb.Container:
    return pb.Container(id=r.id, pod_sandbox_id=r.sandbox_id,
                        metadata=pb.ContainerMetadata(name=r.container_name, attempt=r.attempt),
                        image=pb.ImageSpec(image=r.image), image_ref=r.image_ref, image_id=r.image_id,
                        state=_STATE_TO_PB[r.state], created_at=r.created_at,
                        labels=r.labels, annotations=r.annotations)


list_items = EncodedItems(pb.ListContainersResponse, "containers", to_container)


def to_status(r: ContainerRecord, default_stop_signal: str = "SIGTERM") -> pb.ContainerStatus:
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
        stop_signal=reported_stop_signal(config, r.extra.get("image_stop_signal", ""), default_stop_signal))


def filter_from_pb(f: pb.ContainerFilter) -> ContainerFilter:
    state = _PB_TO_STATE[f.state.state] if f.HasField("state") else None
    return ContainerFilter(id=f.id, state=state, sandbox_id=f.pod_sandbox_id, label_selector=dict(f.label_selector))


async def container_status(svc: Services, req: pb.ContainerStatusRequest) -> pb.ContainerStatusResponse:
    """ContainerStatus returns state, times, exit code and reason, image, mounts and log path; NotFound for an
    unknown id. `verbose` adds pid and shim address as JSON under "info"."""
    r = svc.store.get_container(req.container_id)
    resp = pb.ContainerStatusResponse(status=to_status(r, svc.config.runtime.default_stop_signal))
    if req.verbose:
        resp.info["info"] = json.dumps({"pid": r.pid, "sandboxID": r.sandbox_id, "shimAddress": r.shim_address,
                                        **{k: v for k, v in r.extra.items() if k != trace.KEY}})
        if trace.KEY in r.extra:
            resp.info[trace.KEY] = json.dumps(r.extra[trace.KEY])   # the start-up trace (cri_server/trace.py)
    return resp


async def list_containers(svc: Services, req: pb.ListContainersRequest) -> pb.ListContainersResponse:
    """ListContainers returns the containers matching every set filter field (id, state, sandbox, labels)."""
    flt = filter_from_pb(req.filter) if req.HasField("filter") else ContainerFilter()
    return list_items.response((r for r in svc.store.list_containers(flt) if not r.extra.get("creating")),
                           svc.store.list_containers)
