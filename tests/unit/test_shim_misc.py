"""Small pieces of the shim: config round trip, records, flag parsing, socket addresses, exec ids, exit
records, and the import budget of the daemon path (no root)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shim import exitfile
from shim.main import _parse_go_flags, socket_address
from shim.service import ShimConfig, valid_exec_id
from shim.unixpath import bind_unix, connect_unix, socket_path

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_config_argv_roundtrip():
    for cfg in (ShimConfig(id="a", address="/s", state_dir="/d"),
                ShimConfig(id="b=c", address="/s x", state_dir="/d", namespace="k8s.io", runtime="husk",
                           runtime_root="/r", ttrpc_address="/t", bundle="/b", allowed_uids=(0, 1000),
                           write_address_file=True),
                ShimConfig(id="e", address="/s", state_dir="/d", allowed_uids=())):
        assert ShimConfig.from_argv(cfg.to_argv()) == cfg


def test_record_requires_and_rejects():
    with pytest.raises(TypeError):
        ShimConfig(id="a", address="/s")                 # state_dir missing
    with pytest.raises(TypeError):
        ShimConfig(id="a", address="/s", state_dir="/d", nope=1)
    a = exitfile.ExitRecord(1, 2, 3)
    assert a == exitfile.ExitRecord(pid=1, exit_status=2, exited_at_ns=3, oom_killed=False)
    assert "exit_status=2" in repr(a)


def test_go_flags():
    flags, rest = _parse_go_flags(["-namespace", "k8s.io", "--address=/run/c.sock", "-debug", "-id", "x",
                                   "start"], {"debug"})
    assert flags == {"namespace": "k8s.io", "address": "/run/c.sock", "debug": "true", "id": "x"}
    assert rest == ["start"]
    with pytest.raises(SystemExit):
        _parse_go_flags(["-id"], set())


def test_socket_address_short_and_stable(monkeypatch):
    monkeypatch.delenv("HUSK_SHIM_SOCKET_DIR", raising=False)
    a = socket_address("/run/containerd/containerd.sock", "default", "x" * 64)
    assert a == socket_address("/run/containerd/containerd.sock", "default", "x" * 64)
    assert a != socket_address("/run/containerd/containerd.sock", "other", "x" * 64)
    assert a.startswith("/run/containerd/s/") and len(a) < 108


@pytest.mark.parametrize("eid,ok", [("e1", True), ("exec-abc.1_2", True), ("", False), ("../x", False),
                                    ("a/b", False), (".hidden", False), ("-x", False), ("x" * 129, False)])
def test_exec_ids(eid, ok):
    assert valid_exec_id(eid) is ok


def test_exit_records(tmp_path):
    assert exitfile.read(str(tmp_path)) is None
    exitfile.write(str(tmp_path), "", exitfile.ExitRecord(5, 137, 1_700_000_000_000_000_001, True))
    exitfile.write(str(tmp_path), "e1", exitfile.ExitRecord(6, 0, 2))
    assert exitfile.read(str(tmp_path)) == exitfile.ExitRecord(5, 137, 1_700_000_000_000_000_001, True)
    assert exitfile.read(str(tmp_path), "e1").exit_status == 0
    (tmp_path / "exit-bad").write_text("garbage")
    assert exitfile.read(str(tmp_path), "bad") is None
    exitfile.remove(str(tmp_path), "e1")
    assert exitfile.read(str(tmp_path), "e1") is None
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_wait_status_mapping():
    assert exitfile.status_from_wait(3 << 8) == 3
    assert exitfile.status_from_wait(9) == 137


def test_long_unix_paths(tmp_path):
    import socket
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


def test_daemon_path_import_budget():
    """The shim's daemon path must not import the heavy modules (memory per container)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]);"
            "import shim.daemon, shim.service, shim.events, shim.stdio, shim.cgroup_watch, shim.runtime_driver;"
            "print(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, TOP], capture_output=True, text=True,
                         check=True).stdout.split()
    banned = {"typing", "dataclasses", "logging", "json", "re", "threading", "asyncio", "inspect", "grpc",
              "google.protobuf", "subprocess", "argparse", "click", "shutil", "tempfile"}
    assert banned.isdisjoint(out), sorted(banned.intersection(out))
