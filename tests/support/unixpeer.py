"""A one-connection unix socket server on a thread, for the fake D-Bus peers of the tests (a fake bus, systemd's
private socket): it listens at `path`, accepts one client and hands the connection to `handler`; and a flood of
one message blob down a connected socket, for the tests of a client's deadlines under a stream of messages."""
from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator


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


@contextlib.contextmanager
def flooding(peer: socket.socket, blob: bytes, before: Callable[[socket.socket], None] | None = None) -> Iterator[None]:
    """Sends `blob` down `peer` again and again on a daemon thread (after `before(peer)`, e.g. answering a
    request first) for the duration of the block; then stops, shuts `peer` down (which unblocks a send the
    client no longer reads) and joins the thread. A send failing because the client went away ends it."""
    stop = threading.Event()

    def run() -> None:
        try:
            if before is not None:
                before(peer)
            while not stop.is_set():
                peer.sendall(blob)
        except OSError:
            return
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        peer.shutdown(socket.SHUT_RDWR)
        thread.join(5)
