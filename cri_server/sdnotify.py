"""systemd's readiness protocol (sd_notify): one datagram to $NOTIFY_SOCKET, so a Type=notify unit is "started"
only once husk-cri's CRI socket accepts connections.

Owns nothing else; without $NOTIFY_SOCKET (no systemd, or another unit type) it does nothing.
"""
from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, MutableMapping

log = logging.getLogger(__name__)

READY = "READY=1"
STOPPING = "STOPPING=1"
_taken = ""


def take_socket(environ: MutableMapping[str, str] | None = None) -> str:
    """Removes NOTIFY_SOCKET from the environment (sd_notify's unset_environment) and keeps it for notify():
    the spawner, shims and runtimes inherit husk-cri's environment, and runc, given NOTIFY_SOCKET, proxies it
    into the container and `runc start` waits for the container's own READY=1 (go-runc drops it for that
    reason). Called before the spawner is forked."""
    global _taken
    env = os.environ if environ is None else environ
    _taken = env.pop("NOTIFY_SOCKET", "") or _taken
    return _taken


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Sends `state` (e.g. READY=1) to the socket systemd named in NOTIFY_SOCKET (or the one take_socket kept);
    False when there is none or the send failed (a missing notification is systemd's timeout to report, never a
    reason to stop serving)."""
    env = os.environ if environ is None else environ
    address = env.get("NOTIFY_SOCKET", "") or (_taken if environ is None else "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]          # an abstract socket
    elif not address.startswith("/"):
        log.warning("NOTIFY_SOCKET %r is not a unix socket path; systemd is not told %s", address, state)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(state.encode(), address)
    except OSError as e:
        log.warning("cannot notify systemd (%s) at %s: %s", state, address.replace("\0", "@"), e)
        return False
    return True
