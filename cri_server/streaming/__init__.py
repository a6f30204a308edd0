"""Streaming for kubectl exec/attach/port-forward: the server husk-cri runs, SPDY/3.1 and WebSocket.

Public API: StreamingServer (+ StreamingOptions), the StreamBackend interface with StreamIO, and the
request records. Imports nothing heavy (no grpc, no protobuf, no websockets library).
"""
from __future__ import annotations

from .backend import InputStream, OutputStream, ResizeQueue, StreamBackend, StreamIO, TargetNotFound, \
    TargetNotRunning, TerminalSize, copy_input, copy_output
from .requests import AttachRequest, ExecRequest, InvalidStreamRequest, PortForwardRequest
from .server import StreamingOptions, StreamingServer
from .tokens import TooManyRequests

__all__ = [
    "AttachRequest", "ExecRequest", "InputStream", "InvalidStreamRequest", "OutputStream", "PortForwardRequest",
    "ResizeQueue", "StreamBackend", "StreamIO", "StreamingOptions", "StreamingServer", "TargetNotFound",
    "TargetNotRunning", "TerminalSize", "TooManyRequests", "copy_input", "copy_output",
]
