"""The parent's side of the create sync protocol, with a scripted channel (no processes, no root)."""
from __future__ import annotations

import pytest

from runtime import parent
from runtime.errors import SetupError


class FakeChannel:
    def __init__(self, script: list[tuple[str, str]]) -> None:
        self.script = list(script)
        self.sent: list[tuple[str, str]] = []

    def send(self, verb: str, text: str = "") -> None:
        self.sent.append((verb, text))

    def recv(self) -> tuple[str, str]:
        return self.script.pop(0) if self.script else ("eof", "")


class FakeMgr:
    def __init__(self) -> None:
        self.applied: list[int] = []

    def apply(self, pid: int) -> None:
        self.applied.append(pid)


class FakeProcs:
    def __init__(self) -> None:
        self.init = None
        self.reaped = False

    def reap_pid1(self) -> None:
        self.reaped = True


def ctx() -> parent.CreateContext:
    from runtime.config import Config
    cfg = Config({"ociVersion": "1.0.0", "process": {"args": ["true"], "cwd": "/"}}, "/b", "/b/rootfs")
    return parent.CreateContext(cfg, "c1", "/s", "/s/exec.fifo", "/c1")


def test_ready_before_pid_is_held_until_the_pid_arrives() -> None:
    # the init and the intermediate child share the pipe: "ready" can overtake "pid" (seen as pid 0 before)
    chan = FakeChannel([("ready", ""), ("pid", "4242")])
    mgr, procs = FakeMgr(), FakeProcs()
    assert parent._drive(ctx(), mgr, chan, 17, procs) == 4242
    assert mgr.applied == [17] and chan.sent[0] == ("go", "") and procs.reaped


def test_hooks_before_pid_run_with_the_real_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr(parent, "_create_hooks", lambda c, pid: seen.append(pid))
    chan = FakeChannel([("hooks", ""), ("pid", "99"), ("ready", "")])
    assert parent._drive(ctx(), FakeMgr(), chan, 5, FakeProcs()) == 99
    assert seen == [99] and ("hooksdone", "") in chan.sent


def test_error_and_eof_become_setup_errors() -> None:
    with pytest.raises(SetupError, match="mount /proc: boom"):
        parent._drive(ctx(), FakeMgr(), FakeChannel([("error", "mount /proc: boom")]), 5, FakeProcs())
    with pytest.raises(SetupError, match="exited during setup"):
        parent._drive(ctx(), FakeMgr(), FakeChannel([("pid", "7")]), 5, FakeProcs())
