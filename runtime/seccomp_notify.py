"""The SCMP_ACT_NOTIFY handoff: sends the seccomp listener fd and the container process state to the
agent listening on `linux.seccomp.listenerPath` (SCM_RIGHTS over a unix stream socket, one per connection).

It does not load filters (runtime.seccomp) and does not answer notifications (that is the agent's job).
The container's process cannot reach listenerPath after pivot_root/setns, and the runtime that created it may
be gone by the time the filter is loaded (`start`): so the runtime connects to listenerPath while it still sees
the host (`connect`), the process inherits the connected socket, and right after loading the filter it sends
the state and the listener fd on it (`Handoff.send`), a sendmsg and a close, both refused as notify targets.
"""
from __future__ import annotations

import json
import socket

from runtime.errors import SetupError
from runtime.state import OCI_VERSION

SECCOMP_FD_NAME = "seccompFd"


def process_state(state: dict, pid: int, metadata: str | None) -> dict:
    """The OCI "container process state" record for one seccomp fd; `state` is the container's state
    (ociVersion, id, status, pid, bundle, annotations) as `husk state` prints it."""
    record: dict = {
        "ociVersion": state.get("ociVersion", OCI_VERSION),
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


def connect(listener_path: str, *, timeout: float = 10.0) -> int:
    """Connects to the agent (in the runtime's mount namespace) and returns the socket fd (close-on-exec)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect(listener_path)
        sock.setblocking(True)
    except OSError as err:
        sock.close()
        raise SetupError(f"linux.seccomp.listenerPath {listener_path}: cannot connect to the seccomp agent: "
                         f"{err.strerror or err}") from None
    return sock.detach()


class Handoff:
    """Everything the send needs, built before the filter is loaded (JSON encoding and socket set-up make
    syscalls the profile may refuse); `send` is then one sendmsg (plus sendall for a long state) and a close."""

    def __init__(self, sock_fd: int, state: dict, pid: int, metadata: str | None) -> None:
        self.payload = json.dumps(process_state(state, pid, metadata)).encode()
        self.sock = socket.socket(fileno=sock_fd)
        self.path = listener_path_of(self.sock)

    def send(self, fd: int, _compiled: object = None) -> None:
        """runtime.seccomp.install's on_listener: hands `fd` to the agent, then closes the connection."""
        try:
            sent = socket.send_fds(self.sock, [self.payload], [fd])
            if sent < len(self.payload):
                self.sock.sendall(self.payload[sent:])
        except OSError as err:
            raise SetupError(f"seccomp listener {self.path}: cannot send the notify fd: {err.strerror or err}") \
                from None
        finally:
            self.sock.close()

    def close(self) -> None:
        self.sock.close()


def listener_path_of(sock: socket.socket) -> str:
    try:
        name = sock.getpeername()
    except OSError:
        return "(the seccomp agent's socket)"
    return name if isinstance(name, str) and name else "(the seccomp agent's socket)"
