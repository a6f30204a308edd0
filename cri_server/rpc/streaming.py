"""Exec, Attach and PortForward: validate the target, then hand out a one-time URL of the streaming server.

Also what the streaming backend (cri_server/streaming/husk_backend.py) asks husk-cri: `StoreTargets`
answers `container(id)` (shim address, running, tty, stdin) and `sandbox_netns(id)` from the store.
The sessions themselves belong to cri_server/streaming.
"""
from __future__ import annotations

import logging
import ssl
from typing import Any

from cri_server.api.v1 import api_pb2 as pb
from cri_server.config import ConfigError, StreamingConfig
from cri_server.context import Services
from cri_server.errors import CriError, FailedPrecondition, InvalidArgument, Unimplemented
from cri_server.store.records import ContainerState, SandboxState
from cri_server.validation import check_request

log = logging.getLogger(__name__)


class ResourceExhausted(CriError):
    code = "RESOURCE_EXHAUSTED"


class StoreTargets:
    """StreamTargets over the metadata store (the protocol is defined by the streaming backend)."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc

    async def container(self, container_id: str) -> Any:
        from cri_server.streaming.husk_backend import ContainerTarget
        try:
            rec = self.svc.store.find_container(container_id)
        except CriError:
            return None
        if rec is None or rec.extra.get("creating"):
            return None
        return ContainerTarget(container_id=rec.id, shim_address=rec.shim_address,
                               running=rec.state == ContainerState.RUNNING and bool(rec.shim_address),
                               tty=bool(rec.extra.get("tty")), stdin=bool(rec.extra.get("stdin")),
                               stdin_once=bool(rec.extra.get("stdin_once")))

    async def sandbox_netns(self, sandbox_id: str) -> str | None:
        try:
            rec = self.svc.store.find_sandbox(sandbox_id)
        except CriError:
            return None
        if rec is None or rec.state != SandboxState.READY:
            return None
        return rec.netns_path


def _server(svc: Services) -> Any:
    if svc.streaming is None:
        raise Unimplemented("the streaming server is not running in this husk-cri (no streaming backend)")
    return svc.streaming


def _url(svc: Services, getter: str, req: Any) -> str:
    from cri_server.streaming import InvalidStreamRequest, TooManyRequests
    try:
        return getattr(_server(svc), getter)(req)
    except InvalidStreamRequest as e:
        raise InvalidArgument(str(e)) from None
    except TooManyRequests as e:
        raise ResourceExhausted(str(e)) from None


def _running(svc: Services, container_id: str) -> None:
    rec = svc.store.get_container(container_id)
    if rec.state != ContainerState.RUNNING or not rec.shim_address:
        raise FailedPrecondition(f"container {rec.id} is not running ({rec.state.value})")


async def exec_(svc: Services, req: pb.ExecRequest) -> pb.ExecResponse:
    """Exec returns the URL at which the client runs a command in a running container interactively."""
    check_request(req)
    _running(svc, req.container_id)
    return pb.ExecResponse(url=_url(svc, "get_exec_url", req))


async def attach(svc: Services, req: pb.AttachRequest) -> pb.AttachResponse:
    """Attach returns the URL at which the client connects to a running container's stdio."""
    check_request(req)
    _running(svc, req.container_id)
    return pb.AttachResponse(url=_url(svc, "get_attach_url", req))


async def port_forward(svc: Services, req: pb.PortForwardRequest) -> pb.PortForwardResponse:
    """PortForward returns the URL at which the client forwards ports into a ready pod sandbox."""
    check_request(req)
    rec = svc.store.get_sandbox(req.pod_sandbox_id)
    if rec.state != SandboxState.READY:
        raise FailedPrecondition(f"pod sandbox {rec.id} is not ready")
    return pb.PortForwardResponse(url=_url(svc, "get_port_forward_url", req))


_TLS_KEYS = {"cert": "streaming.tls_cert_file", "key": "streaming.tls_key_file", "ca": "streaming.tls_ca_file"}


def tls_context(config: StreamingConfig) -> ssl.SSLContext | None:
    """The streaming server's TLS context when the config asks for TLS, else None. A missing or bad file is a
    ConfigError naming the key and the file."""
    if not config.tls:
        return None
    from cri_server.streaming.tls import TlsFileError, TlsFiles, server_context
    try:
        return server_context(TlsFiles(config.tls_cert_file, config.tls_key_file, config.tls_ca_file))
    except TlsFileError as e:
        raise ConfigError(_TLS_KEYS[e.which], str(e)) from None


def make_server(svc: Services, tls: ssl.SSLContext | None = None) -> Any:
    """The streaming server with the shim-backed backend (TLS when `tls` is given), or None when this build has
    no backend yet."""
    try:
        from cri_server.streaming.husk_backend import HuskStreamBackend
    except ImportError as e:
        log.warning("streaming is unavailable: %s; Exec, Attach and PortForward answer Unimplemented", e)
        return None
    from cri_server.streaming import StreamingServer
    backend = HuskStreamBackend(StoreTargets(svc))
    st = svc.config.streaming
    if tls is not None:
        log.info("streaming over TLS", extra={"cert": st.tls_cert_file,
                                              "client_certificates": "required" if st.tls_ca_file else "no"})
    return StreamingServer((st.address, st.port), backend, tls=tls)


__all__ = ["StoreTargets", "attach", "exec_", "make_server", "port_forward", "tls_context"]
