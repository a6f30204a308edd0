"""ExecSync, ReopenContainerLog and UpdateContainerResources: calls into a running container's shim.

ExecSync is cri_server/streaming/execsync.py's (the container's process settings, output from the exec's
attach channel capped at 16 MiB per stream, a timeout kills the exec's process group only); this module maps
its results and errors to CRI. No streaming sessions here.
"""
from __future__ import annotations

import dataclasses
import json
import logging

from cri_server.api.v1 import api_pb2 as pb
from cri_server.context import Services
from cri_server.errors import DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument, NotFound
from cri_server.shims import ShimGone
from cri_server.spec.resources import hugepage_policy, linux_resources
from cri_server.store.records import ContainerRecord, ContainerState
from cri_server.validation import check_request

log = logging.getLogger(__name__)


def running_container(svc: Services, container_id: str) -> ContainerRecord:
    rec = svc.store.get_container(container_id)
    if rec.state != ContainerState.RUNNING or not rec.shim_address:
        raise FailedPrecondition(f"container {rec.id} is not running ({rec.state.value})")
    return rec


async def exec_sync(svc: Services, req: pb.ExecSyncRequest) -> pb.ExecSyncResponse:
    """ExecSync runs a command in a running container and returns its output and exit code."""
    check_request(req)
    if req.timeout < 0:
        raise InvalidArgument("timeout: must not be negative")
    from shim import ttrpc_wire as w
    from cri_server.streaming.execsync import ExecSyncTimeout, exec_sync as run
    rec = running_container(svc, req.container_id)
    try:
        res = await run(rec.shim_address, rec.id, list(req.cmd), req.timeout or None)
    except ExecSyncTimeout as e:
        raise DeadlineExceeded(f"{e}; the process was killed") from None
    except w.TtrpcError as e:
        if e.code in (w.FAILED_PRECONDITION, w.NOT_FOUND):
            raise FailedPrecondition(f"container {rec.id} is not running: {e.message}") from None
        raise Internal(f"exec in container {rec.id}: {e.message}") from None
    except (ConnectionError, ShimGone):
        raise FailedPrecondition(f"container {rec.id} is not running (its shim is gone)") from None
    return pb.ExecSyncResponse(stdout=res.stdout, stderr=res.stderr, exit_code=res.exit_code)


async def reopen_container_log(svc: Services, req: pb.ReopenContainerLogRequest) -> pb.ReopenContainerLogResponse:
    """ReopenContainerLog makes the shim reopen the log file after kubelet renamed it (rotation); the
    container must be running."""
    check_request(req)
    from shim import ttrpc_wire as w
    rec = running_container(svc, req.container_id)
    if not rec.log_path:
        raise FailedPrecondition(f"container {rec.id} has no log file")
    try:
        await svc.need_shims().husk_call(rec.id, rec.shim_address, "ReopenLog", id=rec.id)
    except w.TtrpcError as e:
        raise Internal(f"reopen the log of container {rec.id}: {e.message}") from None
    except ShimGone:
        raise FailedPrecondition(f"container {rec.id} is not running") from None
    return pb.ReopenContainerLogResponse()


async def update_container_resources(svc: Services,
                                     req: pb.UpdateContainerResourcesRequest) -> pb.UpdateContainerResourcesResponse:
    """UpdateContainerResources applies new cgroup limits to a running (or created) container at once and
    records them, so ContainerStatus reports them."""
    check_request(req)
    from shim import ttrpc_wire as w
    from shim.pb import google
    rec = svc.store.get_container(req.container_id)
    async with svc.locks.hold(rec.id):
        rec = svc.store.get_container(rec.id)
        if rec.state not in (ContainerState.RUNNING, ContainerState.CREATED) or not rec.shim_address:
            raise FailedPrecondition(f"container {rec.id} is {rec.state.value}: its resources cannot change")
        if not req.HasField("linux"):
            return pb.UpdateContainerResourcesResponse()
        resources = linux_resources(req.linux, "linux", svc.host.swap_controller if svc.host else False,
                                    hugepage_policy(svc.host) if svc.host else False)
        try:
            await svc.need_shims().call(rec.id, rec.shim_address, "Update", id=rec.id,
                                        resources=google.Any(type_url="types.containerd.io/opencontainers/"
                                                             "runtime-spec/1/LinuxResources",
                                                             value=json.dumps(resources).encode()))
        except w.TtrpcError as e:
            if e.code == w.NOT_FOUND:
                raise NotFound(f"container {rec.id}: {e.message}") from None
            raise Internal(f"update the resources of container {rec.id}: {e.message}") from None
        except ShimGone:
            raise FailedPrecondition(f"container {rec.id} is not running") from None
        config = pb.ContainerConfig.FromString(rec.config) if rec.config else pb.ContainerConfig()
        config.linux.resources.CopyFrom(req.linux)
        svc.store.put_container(dataclasses.replace(svc.store.get_container(rec.id),
                                                    config=config.SerializeToString()))
    return pb.UpdateContainerResourcesResponse()
