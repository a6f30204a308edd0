"""husk-cri binds its CRI socket under a temporary name beside the path (daemon.bound_name) and renames it into
place once it listens; at start it removes such names that a killed husk-cri left, but not a live one."""
from __future__ import annotations

import os
import socket

from cri_server import daemon


def _socket_file(path: str, listening: bool) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    if listening:
        s.listen(1)
        return s
    s.close()                         # the file stays, nobody listens: what a killed process leaves
    return None


def test_stale_temporary_sockets_go_live_ones_and_other_files_stay(tmp_path):
    path = str(tmp_path / "cri.sock")
    stale = daemon.bound_name(path, 4242)
    live_name = daemon.bound_name(path, 4343)
    assert os.path.basename(stale) == ".4242.sock"
    _socket_file(stale, listening=False)
    live = _socket_file(live_name, listening=True)
    other = tmp_path / ".x.sock"
    other.write_text("")
    try:
        daemon.clear_stale_bound(path)
        assert sorted(os.listdir(tmp_path)) == [".4343.sock", ".x.sock"]
    finally:
        assert live is not None
        live.close()


def test_no_directory_is_nothing_to_clear(tmp_path):
    daemon.clear_stale_bound(str(tmp_path / "missing" / "cri.sock"))
