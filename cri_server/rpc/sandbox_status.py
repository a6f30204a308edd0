"""PodSandboxStatus and ListPodSandbox: what kubelet's PLEG reads every second, answered from the index.

Never touches the disk or a shim: the records are in memory (list items encoded once per record change,
rpc/listing.py). Stats belong to rpc/stats.py.
"""
from __future__ import annotations

import json
import time

from cri_server import trace
from cri_server.api.v1 import api_pb2 as pb
from cri_server.context import Services
from cri_server.rpc.listing import EncodedItems
from cri_server.store.records import SandboxFilter, SandboxRecord, SandboxState
from cri_server.validation import check_request

_STATE_TO_PB = {SandboxState.READY: pb.SANDBOX_READY, SandboxState.NOTREADY: pb.SANDBOX_NOTREADY,
                SandboxState.CREATING: pb.SANDBOX_NOTREADY}
_PB_TO_STATE = {pb.SANDBOX_READY: SandboxState.READY, pb.SANDBOX_NOTREADY: SandboxState.NOTREADY}


def _metadata(r: SandboxRecord) -> pb.PodSandboxMetadata:
    return pb.PodSandboxMetadata(name=r.pod_name, uid=r.pod_uid, namespace=r.pod_namespace, attempt=r.attempt)


def to_pod_sandbox(r: SandboxRecord) -> pb.PodSandbox:
    return pb.PodSandbox(id=r.id, metadata=_metadata(r), state=_STATE_TO_PB[r.state], created_at=r.created_at,
                         labels=r.labels, annotations=r.annotations, runtime_handler=r.runtime_handler)


def to_status(r: SandboxRecord) -> pb.PodSandboxStatus:
    config = pb.PodSandboxConfig.FromString(r.config)
    ns = config.linux.security_context.namespace_options
    network = pb.PodSandboxNetworkStatus()
    if r.ips:
        network.ip = r.ips[0]
        network.additional_ips.extend(pb.PodIP(ip=ip) for ip in r.ips[1:])
    return pb.PodSandboxStatus(
        id=r.id, metadata=_metadata(r), state=_STATE_TO_PB[r.state], created_at=r.created_at, network=network,
        linux=pb.LinuxPodSandboxStatus(namespaces=pb.Namespace(options=pb.NamespaceOption(
            network=ns.network, pid=ns.pid, ipc=ns.ipc, target_id=ns.target_id))),
        labels=r.labels, annotations=r.annotations, runtime_handler=r.runtime_handler)


list_items = EncodedItems(pb.ListPodSandboxResponse, "items", to_pod_sandbox)


def filter_from_pb(f: pb.PodSandboxFilter) -> SandboxFilter:
    state = _PB_TO_STATE[f.state.state] if f.HasField("state") else None
    return SandboxFilter(id=f.id, state=state, label_selector=dict(f.label_selector))


async def pod_sandbox_status(svc: Services, req: pb.PodSandboxStatusRequest) -> pb.PodSandboxStatusResponse:
    """PodSandboxStatus returns the sandbox's state, IPs, namespaces, labels and annotations; NotFound for an
    unknown id. `verbose` adds the record's runtime details (pid, netns, shim) as JSON under "info"."""
    r = svc.store.get_sandbox(req.pod_sandbox_id)
    resp = pb.PodSandboxStatusResponse(status=to_status(r), timestamp=time.time_ns())
    if req.verbose:
        resp.info["info"] = json.dumps({"pid": r.pid, "netnsPath": r.netns_path, "shimAddress": r.shim_address,
                                        "cgroupParent": r.cgroup_parent, "podDir": r.pod_dir,
                                        "state": r.state.value,
                                        **{k: v for k, v in r.extra.items() if k != trace.KEY}})
        if trace.KEY in r.extra:
            resp.info[trace.KEY] = json.dumps(r.extra[trace.KEY])   # the start-up trace (cri_server/trace.py)
    return resp


async def list_pod_sandbox(svc: Services, req: pb.ListPodSandboxRequest) -> pb.ListPodSandboxResponse:
    """ListPodSandbox returns the sandboxes matching every set filter field (id or id prefix, state, labels)."""
    flt = filter_from_pb(req.filter) if req.HasField("filter") else SandboxFilter()
    return list_items.response((r for r in svc.store.list_sandboxes(flt) if r.state != SandboxState.CREATING),
                           svc.store.list_sandboxes)


async def update_pod_sandbox_resources(svc: Services, req: pb.UpdatePodSandboxResourcesRequest
                                       ) -> pb.UpdatePodSandboxResourcesResponse:
    """UpdatePodSandboxResources: kubelet has resized the pod's cgroup itself; the runtime records the new
    pod-level resources (shown by verbose PodSandboxStatus). NotFound for an unknown sandbox."""
    check_request(req)
    import dataclasses
    from google.protobuf import json_format
    r = svc.store.get_sandbox(req.pod_sandbox_id)
    async with svc.locks.hold(r.id):
        r = svc.store.get_sandbox(r.id)
        resources = {"overhead": json_format.MessageToDict(req.overhead) if req.HasField("overhead") else None,
                     "resources": json_format.MessageToDict(req.resources) if req.HasField("resources") else None}
        svc.store.put_sandbox(dataclasses.replace(r, extra={**r.extra, "podResources": resources}))
    return pb.UpdatePodSandboxResourcesResponse()
