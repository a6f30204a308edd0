"""The cached streaming requests (exec, attach, port-forward) and their validation.

Owns the records that a token stands for. Accepts the CRI protobuf messages or anything with the same
attribute names, so husk-cri can pass its ExecRequest as is. Must not import grpc or protobuf.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class InvalidStreamRequest(ValueError):
    """A request the streaming server refuses to issue a URL for (gRPC INVALID_ARGUMENT)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def _check_stdio(tty: bool, stdin: bool, stdout: bool, stderr: bool) -> None:
    if tty and stderr:
        # A terminal multiplexes stdout and stderr into one stream.
        raise InvalidStreamRequest("stderr", "tty and stderr cannot both be true")
    if not (stdin or stdout or stderr):
        raise InvalidStreamRequest("stdin", "one of stdin, stdout, or stderr must be set")


@dataclass(frozen=True)
class ExecRequest:
    container_id: str
    cmd: tuple[str, ...]
    tty: bool = False
    stdin: bool = False
    stdout: bool = False
    stderr: bool = False

    def __post_init__(self) -> None:
        if not self.container_id:
            raise InvalidStreamRequest("container_id", "missing required container_id")
        if not self.cmd:
            raise InvalidStreamRequest("cmd", "missing required cmd")
        if not all(isinstance(a, str) for a in self.cmd):
            raise InvalidStreamRequest("cmd", "every argument must be a string")
        _check_stdio(self.tty, self.stdin, self.stdout, self.stderr)

    @classmethod
    def of(cls, req: Any) -> ExecRequest:
        if isinstance(req, cls):
            return req
        return cls(str(req.container_id), tuple(req.cmd), bool(req.tty), bool(req.stdin),
                   bool(req.stdout), bool(req.stderr))


@dataclass(frozen=True)
class AttachRequest:
    container_id: str
    tty: bool = False
    stdin: bool = False
    stdout: bool = False
    stderr: bool = False

    def __post_init__(self) -> None:
        if not self.container_id:
            raise InvalidStreamRequest("container_id", "missing required container_id")
        _check_stdio(self.tty, self.stdin, self.stdout, self.stderr)

    @classmethod
    def of(cls, req: Any) -> AttachRequest:
        if isinstance(req, cls):
            return req
        return cls(str(req.container_id), bool(req.tty), bool(req.stdin), bool(req.stdout), bool(req.stderr))


@dataclass(frozen=True)
class PortForwardRequest:
    pod_sandbox_id: str
    # Only WebSocket port-forward uses these (one channel pair per port); over SPDY every stream
    # names its port in a header, as in kubelet's server.
    ports: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.pod_sandbox_id:
            raise InvalidStreamRequest("pod_sandbox_id", "missing required pod_sandbox_id")
        for p in self.ports:
            if not isinstance(p, int) or not 0 < p < 65536:
                raise InvalidStreamRequest("port", f"port {p!r} is not in 1..65535")

    @classmethod
    def of(cls, req: Any) -> PortForwardRequest:
        if isinstance(req, cls):
            return req
        ports = getattr(req, "port", None) or getattr(req, "ports", None) or ()  # CRI names it "port"
        return cls(str(req.pod_sandbox_id), tuple(int(p) for p in ports))
