"""shim.unixpath: unix sockets at paths longer than sun_path (108 bytes), and unix:// addresses."""
from __future__ import annotations

import socket

from shim.unixpath import bind_unix, connect_unix, socket_path


def test_long_unix_paths(tmp_path):
    d = tmp_path / ("d" * 100)
    d.mkdir()
    path = str(d / "sock")
    assert len(path) > 108
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bind_unix(srv, path)
    srv.listen(1)
    cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connect_unix(cli, path)
    conn, _ = srv.accept()
    cli.sendall(b"x")
    assert conn.recv(1) == b"x"
    for s in (conn, cli, srv):
        s.close()
    assert socket_path("unix:///a/b") == "/a/b" and socket_path("/a/b") == "/a/b"
