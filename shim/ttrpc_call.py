"""Building ttrpc requests, reading responses, and one blocking call without threads.

Used by the shim itself (event publishing) and by the clients in shim/client.py; stdlib only.
"""
from __future__ import annotations

import socket

from shim import ttrpc_wire as w
from shim.pb import rpc_status, ttrpc
from shim.protobuf import Message
from shim.unixpath import connect_unix, socket_path


def make_request(service: str, method: str, req: Message, timeout: float | None,
                 metadata: dict[str, str] | None) -> bytes:
    r = ttrpc.Request(service=service, method=method, payload=req.encode(),
                      timeout_nano=int(timeout * 1e9) if timeout else 0,
                      metadata=[ttrpc.KeyValue(key=k, value=v) for k, v in (metadata or {}).items()])
    return r.encode()


def read_result(payload: bytes, resp_type: type[Message]) -> Message:
    resp = ttrpc.Response.decode(payload)
    st: rpc_status.Status | None = resp.status
    if st is not None and st.code != w.OK:
        raise w.TtrpcError(st.code, st.message)
    return resp_type.decode(resp.payload)


def call_once(address: str, service: str, method: str, req: Message, resp_type: type[Message],
              timeout: float = 5.0, metadata: dict[str, str] | None = None):
    """One blocking call on a fresh connection, no threads (the shim's event publisher uses this)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        connect_unix(sock, socket_path(address))
        sock.sendall(w.frame(1, w.TYPE_REQUEST, make_request(service, method, req, timeout, metadata)))
        reader = w.FrameReader()
        while True:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError(f"{service}/{method}: connection closed before the answer")
            reader.feed(data)
            for sid, mtype, _flags, payload in reader.frames():
                if sid == 1 and mtype == w.TYPE_RESPONSE:
                    if payload is None:
                        raise w.TtrpcError(w.RESOURCE_EXHAUSTED, "response too large")
                    return read_result(payload, resp_type)
    finally:
        sock.close()
