"""The gRPC servicers: bind each CRI method to its handler in cri_server/rpc and map errors to status codes.

A handler raises a CriError (errors.py) and the client gets that code and message; anything else is logged
with its traceback and sent as INTERNAL. Methods phase 2 has not wired yet answer UNIMPLEMENTED, naming what
they wait for. This module holds no state of its own.
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
from cri_server.rpc import container_status, runtime_info, sandbox_status

log = logging.getLogger("cri_server.rpc")

Handler = Callable[[Services, Any], Awaitable[Any]]

# Methods answered with UNIMPLEMENTED until the part they need lands, and why.
PENDING_RUNTIME = {
    "RunPodSandbox": "needs the shim (pause container)",
    "StopPodSandbox": "needs the shim",
    "RemovePodSandbox": "needs the shim",
    "StreamPodSandboxes": "not supported; kubelet falls back to ListPodSandbox",
    "CreateContainer": "needs the image store and the shim",
    "StartContainer": "needs the shim",
    "StopContainer": "needs the shim",
    "RemoveContainer": "needs the shim",
    "StreamContainers": "not supported; kubelet falls back to ListContainers",
    "UpdateContainerResources": "needs the shim",
    "ReopenContainerLog": "needs the shim",
    "ExecSync": "needs the shim",
    "Exec": "needs the streaming server",
    "Attach": "needs the streaming server",
    "PortForward": "needs the streaming server",
    "ContainerStats": "needs the shim",
    "ListContainerStats": "needs the shim",
    "StreamContainerStats": "not supported; kubelet falls back to ListContainerStats",
    "PodSandboxStats": "needs the shim",
    "ListPodSandboxStats": "needs the shim",
    "StreamPodSandboxStats": "not supported",
    "CheckpointContainer": "container checkpointing is not supported",
    "GetContainerEvents": "needs the shim's exit events",
    "ListMetricDescriptors": "CRI metrics are not supported",
    "ListPodSandboxMetrics": "CRI metrics are not supported",
    "StreamPodSandboxMetrics": "CRI metrics are not supported",
    "UpdatePodSandboxResources": "needs the shim",
}
PENDING_IMAGE = {
    "ListImages": "needs the image store",
    "StreamImages": "not supported; kubelet falls back to ListImages",
    "ImageStatus": "needs the image store",
    "PullImage": "needs the image store",
    "RemoveImage": "needs the image store",
    "ImageFsInfo": "needs the image store",
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
            await _abort(context, e.code, e.message)
            raise AssertionError("unreachable: abort raises") from e
        except Exception as e:  # noqa: BLE001 -- any other failure is a bug: log it, answer INTERNAL
            log.exception("%s: internal error", name, extra={"rpc": name})
            await _abort(context, "INTERNAL", f"{name}: internal error: {type(e).__name__}: {e}")
            raise AssertionError("unreachable: abort raises") from e
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s ok", name, extra={"rpc": name, "ms": round((time.perf_counter() - t0) * 1e3, 3)})
        return resp
    return method


def _pending(name: str, why: str) -> Callable[..., Awaitable[Any]]:
    async def method(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _abort(context, Unimplemented.code, f"{name} is not implemented by husk-cri yet: {why}")
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


class ImageServicer(api_pb2_grpc.ImageServiceServicer):
    def __init__(self, services: Services) -> None:
        self.services = services


for _name, _why in PENDING_RUNTIME.items():
    setattr(RuntimeServicer, _name, _pending(_name, _why))
for _name, _why in PENDING_IMAGE.items():
    setattr(ImageServicer, _name, _pending(_name, _why))
