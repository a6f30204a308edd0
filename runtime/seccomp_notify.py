"""The SCMP_ACT_NOTIFY handoff: sends the seccomp listener fd and the container process state to the
agent listening on `linux.seccomp.listenerPath` (SCM_RIGHTS over a unix stream socket, one per connection).

It does not load filters (runtime.seccomp) and does not answer notifications (that is the agent's job).
The container's init cannot reach listenerPath after pivot_root: it passes the fd to the runtime process
outside (e.g. socket.send_fds on its sync socket), which calls send_listener_fd.
"""
from __future__ import annotations

import json
import socket

from runtime.errors import SetupError

SECCOMP_FD_NAME = "seccompFd"


def process_state(state: dict, pid: int, metadata: str | None) -> dict:
    """The OCI "container process state" record for one seccomp fd; `state` is the container's state
    (ociVersion, id, status, pid, bundle, annotations) as `husk state` prints it."""
    record: dict = {
        "ociVersion": state.get("ociVersion", "1.0.2"),
        "fds": [SECCOMP_FD_NAME],
        "pid": pid,
        "state": state,
    }
    if metadata is not None:
        record["metadata"] = metadata
    return record


def send_listener_fd(listener_path: str, fd: int, state: dict, pid: int, metadata: str | None = None,
                     *, timeout: float = 10.0) -> None:
    """Connects to `listener_path`, sends the process state as JSON with `fd` attached to the first
    message, and closes the connection. Any failure is a SetupError naming the socket (the spec makes
    it fatal for the container)."""
    payload = json.dumps(process_state(state, pid, metadata)).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(timeout)
            sock.connect(listener_path)
            sent = socket.send_fds(sock, [payload], [fd])
            if sent < len(payload):
                sock.sendall(payload[sent:])  # the fd went with the first part only, as the spec requires
    except OSError as err:
        raise SetupError(f"seccomp listener {listener_path}: cannot send the notify fd: "
                         f"{err.strerror or err}") from err
