"""Dialing a TCP port from inside a pod's network namespace, for the port_forward of a StreamBackend.

Owns the setns dance: the socket is created by a short-lived thread that entered the namespace, so
the socket belongs to the pod's network stack while the event loop's thread never changes namespace.
Must not connect anywhere itself on the host's stack unless told there is no namespace.
"""
from __future__ import annotations

import asyncio
import os
import socket
import threading

from runtime.linux import syscalls


def _socket_in_netns(netns_path: str, family: int) -> socket.socket:
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        os.close(own)
        raise
    try:
        syscalls.setns(target, syscalls.CLONE_NEWNET)
        try:
            return socket.socket(family, socket.SOCK_STREAM)
        finally:
            # The thread ends right after this, so even a failed switch back cannot leak the
            # namespace into other work; it is still attempted to keep the thread's state honest.
            syscalls.setns(own, syscalls.CLONE_NEWNET)
    finally:
        os.close(target)
        os.close(own)


async def _make_socket(netns_path: str, family: int) -> socket.socket:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[socket.socket] = loop.create_future()

    def work() -> None:
        try:
            sock = _socket_in_netns(netns_path, family)
        except BaseException as exc:  # handed to the awaiting coroutine, not lost in the thread
            error = exc  # `exc` itself is unbound once this except block ends

            def fail() -> None:
                if not fut.done():
                    fut.set_exception(error)
            loop.call_soon_threadsafe(fail)
        else:
            def deliver() -> None:
                if fut.done():  # the caller was cancelled meanwhile
                    sock.close()
                else:
                    fut.set_result(sock)
            loop.call_soon_threadsafe(deliver)

    # A fresh thread, not an executor pool: a pool thread would outlive a failed switch back.
    threading.Thread(target=work, name="husk-netns-dial", daemon=True).start()
    return await fut


async def open_connection_in_netns(netns_path: str | None, port: int, host: str = "127.0.0.1"
                                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to host:port as seen from the network namespace at netns_path (a bind-mounted
    /var/run/netns/<name> or /proc/<pid>/ns/net). None means the host's own namespace (hostNetwork
    pods). Raises OSError (ConnectionRefusedError, FileNotFoundError for a missing namespace...)."""
    if netns_path is None:
        return await asyncio.open_connection(host, port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = await _make_socket(netns_path, family)
    try:
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)
