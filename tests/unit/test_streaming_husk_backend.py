"""HuskStreamBackend without a shim: the exec process spec, target checks, the first terminal size."""
from __future__ import annotations

import asyncio
import errno
import json

import pytest

from cri_server.streaming import AttachRequest, ExecRequest, PortForwardRequest, ResizeQueue, TargetNotFound, \
    TargetNotRunning, TerminalSize
from cri_server.streaming.husk_backend import HuskStreamBackend, _first_size
from cri_server.streaming.shimexec import exec_process_spec, load_container_process
from cri_server.streaming.targets import ContainerTarget, StreamTargets

PROCESS = {
    "terminal": False, "user": {"uid": 1000, "gid": 1000, "additionalGids": [5]}, "args": ["/pause"],
    "env": ["PATH=/bin", "TERM=dumb", "A=b"], "cwd": "/work", "commandLine": "ignored",
    "capabilities": {"bounding": ["CAP_CHOWN"], "effective": ["CAP_CHOWN"]}, "noNewPrivileges": True,
    "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}], "apparmorProfile": "p",
    "consoleSize": {"width": 1, "height": 1},
}


def test_exec_spec_keeps_the_container_process_settings():
    spec = exec_process_spec(PROCESS, ["ls", "-l"], tty=False)
    assert spec["args"] == ["ls", "-l"] and spec["terminal"] is False
    for key in ("user", "env", "cwd", "capabilities", "noNewPrivileges", "rlimits", "apparmorProfile"):
        assert spec[key] == PROCESS[key]
    assert "commandLine" not in spec and "consoleSize" not in spec
    assert PROCESS["args"] == ["/pause"]  # the container's own record is not changed


def test_exec_spec_for_a_tty():
    spec = exec_process_spec(PROCESS, ["sh"], tty=True, console_size=(120, 40))
    assert spec["terminal"] is True
    assert spec["env"] == ["PATH=/bin", "A=b", "TERM=xterm"]
    assert spec["consoleSize"] == {"width": 120, "height": 40}
    assert "consoleSize" not in exec_process_spec(PROCESS, ["sh"], tty=True)


def test_load_container_process(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "process": PROCESS}))
    assert load_container_process(str(tmp_path)) == PROCESS
    (tmp_path / "config.json").write_text(json.dumps({"ociVersion": "1.0.2"}))
    with pytest.raises(ValueError, match="no process"):
        load_container_process(str(tmp_path))


class FakeTargets:
    def __init__(self) -> None:
        self.containers = {"run": ContainerTarget("run", "/nowhere.sock", True, False, False),
                           "dead": ContainerTarget("dead", "/nowhere.sock", False, False, False)}
        self.netns = {"pod": "/var/run/netns/none", "host": ""}

    async def container(self, container_id: str) -> ContainerTarget | None:
        return self.containers.get(container_id)

    async def sandbox_netns(self, sandbox_id: str) -> str | None:
        return self.netns.get(sandbox_id)


def test_fake_targets_satisfy_the_protocol():
    assert isinstance(FakeTargets(), StreamTargets)


def test_check_unknown_and_stopped_targets():
    be = HuskStreamBackend(FakeTargets())

    async def main():
        await be.check(ExecRequest("run", ("true",), stdout=True))
        await be.check(PortForwardRequest("host"))
        with pytest.raises(TargetNotRunning):
            await be.check(AttachRequest("dead", stdout=True))
        with pytest.raises(TargetNotFound):
            await be.check(ExecRequest("nope", ("true",), stdout=True))
        with pytest.raises(TargetNotFound):
            await be.check(PortForwardRequest("nope"))
        with pytest.raises(FileNotFoundError) as exc:
            await be.port_forward("nope", 80)
        assert exc.value.errno == errno.ENOENT
    asyncio.run(main())


def test_first_size_skips_empty_sizes_and_gives_up_when_none_comes():
    async def main():
        q = ResizeQueue()
        q.put(TerminalSize(0, 0))
        q.put(TerminalSize(80, 24))
        assert await _first_size(q, 5) == TerminalSize(80, 24)
        assert await _first_size(ResizeQueue(), 0.01) is None
        closed = ResizeQueue()
        closed.close()
        assert await _first_size(closed, 5) is None
    asyncio.run(main())
