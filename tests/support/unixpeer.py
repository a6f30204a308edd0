"""A one-connection unix socket server on a thread, for the fake D-Bus peers of the tests (a fake bus, systemd's
private socket): it listens at `path`, accepts one client and hands the connection to `handler`."""
from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def serve_one(path: str, handler: Callable[[socket.socket], None]) -> tuple[socket.socket, threading.Thread]:
    """Listens at `path` now (a client may connect as soon as this returns) and runs `handler(conn)` on a
    daemon thread once a client connects; the connection is closed when the handler returns. Returns the
    listener (close it to stop) and the thread."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def run() -> None:
        conn, _ = listener.accept()
        with conn:
            handler(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return listener, thread
