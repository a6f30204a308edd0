"""The gRPC servicers: bind each CRI method to its handler in cri_server/rpc and map errors to status codes.

A handler raises a CriError (errors.py) and the client gets that code and message; anything else is logged
with its traceback and sent as INTERNAL. The few methods husk-cri does not support answer UNIMPLEMENTED with
the reason. This module holds no state of its own.
"""
from __future__ import annotations

import functools
import logging
import time
from typing import Any, Awaitable, Callable

import grpc

from cri_server.api.v1 import api_pb2_grpc
from cri_server.context import Services
from cri_server.errors import CriError, Unimplemented
from cri_server.rpc import (container_create, container_exec, container_lifecycle, container_status, events,
                            images, metrics, runtime_info, sandbox_run, sandbox_status, sandbox_stop, stats,
                            streaming)

log = logging.getLogger("cri_server.rpc")

Handler = Callable[[Services, Any], Awaitable[Any]]

# Methods answered with UNIMPLEMENTED, and why (kubelet falls back or does without each of them).
PENDING_RUNTIME = {
    "StreamPodSandboxes": "not supported; kubelet falls back to ListPodSandbox",
    "StreamContainers": "not supported; kubelet falls back to ListContainers",
    "StreamContainerStats": "not supported; kubelet falls back to ListContainerStats",
    "StreamPodSandboxStats": "not supported; kubelet falls back to ListPodSandboxStats",
    "CheckpointContainer": "container checkpointing is not supported",
}
PENDING_IMAGE = {
    "StreamImages": "not supported; kubelet falls back to ListImages",
}


async def _abort(context: grpc.aio.ServicerContext, code: str, message: str) -> None:
    await context.abort(getattr(grpc.StatusCode, code), message)


def _bind(name: str, handler: Handler) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(handler)
    async def method(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        t0 = time.perf_counter()
        try:
            resp = await handler(self.services, request)
        except CriError as e:
            log.info("%s failed: %s", name, e.message,
                     extra={"rpc": name, "code": e.code, "ms": round((time.perf_counter() - t0) * 1e3, 3)})
            failure = (e.code, e.message)
        except Exception as e:  # noqa: BLE001 -- any other failure is a bug: log it, answer INTERNAL
            log.exception("%s: internal error", name, extra={"rpc": name})
            failure = ("INTERNAL", f"{name}: internal error: {type(e).__name__}: {e}")
        else:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s ok", name, extra={"rpc": name, "ms": round((time.perf_counter() - t0) * 1e3, 3)})
            return resp
        # Aborted outside the except blocks and without the request: grpc keeps the abort's traceback in a
        # reference cycle, which held the request (and the handler's frames) until the next full collection:
        # each refused 10 MB request stayed in memory.
        del request
        await _abort(context, *failure)
        raise AssertionError("unreachable: abort raises")
    return method


def _bind_stream(name: str, handler: Callable[[Services, Any], Any]) -> Callable[..., Any]:
    async def method(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            async for item in handler(self.services, request):
                yield item
        except CriError as e:
            await _abort(context, e.code, e.message)

    method.__name__ = name
    return method


def _pending(name: str, why: str) -> Callable[..., Awaitable[Any]]:
    async def method(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _abort(context, Unimplemented.code, f"{name} is not supported by husk-cri: {why}")
    method.__name__ = name
    return method


class RuntimeServicer(api_pb2_grpc.RuntimeServiceServicer):
    def __init__(self, services: Services) -> None:
        self.services = services

    Version = _bind("Version", runtime_info.version)
    Status = _bind("Status", runtime_info.status)
    RuntimeConfig = _bind("RuntimeConfig", runtime_info.runtime_config)
    UpdateRuntimeConfig = _bind("UpdateRuntimeConfig", runtime_info.update_runtime_config)
    PodSandboxStatus = _bind("PodSandboxStatus", sandbox_status.pod_sandbox_status)
    ListPodSandbox = _bind("ListPodSandbox", sandbox_status.list_pod_sandbox)
    ContainerStatus = _bind("ContainerStatus", container_status.container_status)
    ListContainers = _bind("ListContainers", container_status.list_containers)
    RunPodSandbox = _bind("RunPodSandbox", sandbox_run.run_pod_sandbox)
    StopPodSandbox = _bind("StopPodSandbox", sandbox_stop.stop_pod_sandbox)
    RemovePodSandbox = _bind("RemovePodSandbox", sandbox_stop.remove_pod_sandbox)
    UpdatePodSandboxResources = _bind("UpdatePodSandboxResources", sandbox_status.update_pod_sandbox_resources)
    CreateContainer = _bind("CreateContainer", container_create.create_container)
    StartContainer = _bind("StartContainer", container_lifecycle.start_container)
    StopContainer = _bind("StopContainer", container_lifecycle.stop_container)
    RemoveContainer = _bind("RemoveContainer", container_lifecycle.remove_container)
    ExecSync = _bind("ExecSync", container_exec.exec_sync)
    ReopenContainerLog = _bind("ReopenContainerLog", container_exec.reopen_container_log)
    UpdateContainerResources = _bind("UpdateContainerResources", container_exec.update_container_resources)
    Exec = _bind("Exec", streaming.exec_)
    Attach = _bind("Attach", streaming.attach)
    PortForward = _bind("PortForward", streaming.port_forward)
    ContainerStats = _bind("ContainerStats", stats.container_stats)
    ListContainerStats = _bind("ListContainerStats", stats.list_container_stats)
    PodSandboxStats = _bind("PodSandboxStats", stats.pod_sandbox_stats)
    ListPodSandboxStats = _bind("ListPodSandboxStats", stats.list_pod_sandbox_stats)
    ListMetricDescriptors = _bind("ListMetricDescriptors", metrics.list_metric_descriptors)
    ListPodSandboxMetrics = _bind("ListPodSandboxMetrics", metrics.list_pod_sandbox_metrics)
    StreamPodSandboxMetrics = _bind_stream("StreamPodSandboxMetrics", metrics.stream_pod_sandbox_metrics)
    GetContainerEvents = _bind_stream("GetContainerEvents", events.get_container_events)


class ImageServicer(api_pb2_grpc.ImageServiceServicer):
    def __init__(self, services: Services) -> None:
        self.services = services

    ListImages = _bind("ListImages", images.list_images)
    ImageStatus = _bind("ImageStatus", images.image_status)
    PullImage = _bind("PullImage", images.pull_image)
    RemoveImage = _bind("RemoveImage", images.remove_image)
    ImageFsInfo = _bind("ImageFsInfo", images.image_fs_info)


for _name, _why in PENDING_RUNTIME.items():
    setattr(RuntimeServicer, _name, _pending(_name, _why))
for _name, _why in PENDING_IMAGE.items():
    setattr(ImageServicer, _name, _pending(_name, _why))
