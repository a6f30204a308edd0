"""husk-shim's command line and config: ShimConfig's argv round trip and record rules, containerd's Go-style
flags, socket addresses, exec ids (no root)."""
from __future__ import annotations

import pytest

from shim import exitfile
from shim.main import _parse_go_flags, socket_address
from shim.service import ShimConfig, valid_exec_id


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
