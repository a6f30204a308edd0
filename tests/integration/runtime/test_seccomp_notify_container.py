"""SCMP_ACT_NOTIFY through `husk run` and `husk exec`: the runtime connects to linux.seccomp.listenerPath, the
container's process hands over its listener fd with the OCI "container process state" right after loading the
filter, and the agent's answers are what the container's syscalls return."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import select
import socket
import struct
import subprocess
import threading
from pathlib import Path

import pytest

from tests.integration.conftest import unique

pytestmark = pytest.mark.root

NOTIF_RECV = 0xC0502100  # SECCOMP_IOCTL_NOTIF_RECV: struct seccomp_notif (80 bytes)
NOTIF_SEND = 0xC0182101  # SECCOMP_IOCTL_NOTIF_SEND: struct seccomp_notif_resp (24 bytes)
NR_MKDIR, NR_MKDIRAT = 83, 258  # x86_64


class Agent:
    """A seccomp agent: takes each handoff (one per connection) and answers every notification on it with a fake
    success (mkdir "works" but creates nothing) until the notify fd hangs up (its processes exited)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.records: list[dict] = []
        self.answered: list[int] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.threads = [threading.Thread(target=self._serve, daemon=True)]
        self.threads[0].start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                with conn:
                    conn.settimeout(30)
                    msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
                    while True:
                        more = conn.recv(1 << 20)
                        if not more:
                            break
                        msg += more
                if not fds:
                    continue  # a container deleted before it started: the connection closes without data
                self.records.append(json.loads(msg))
                t = threading.Thread(target=self._answer, args=(fds[0],), daemon=True)
                self.threads.append(t)
                t.start()
            except Exception as e:  # noqa: BLE001 - reported by the test
                self.errors.append(repr(e))

    def _answer(self, fd: int) -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        try:
            while not self.stop.is_set():
                events = poller.poll(200)
                if not events:
                    continue
                if events[0][1] & select.POLLHUP:
                    return  # every process using the filter has exited
                buf = bytearray(80)
                try:
                    fcntl.ioctl(fd, NOTIF_RECV, buf, True)
                except OSError as e:
                    if e.errno == errno.ENOENT:
                        continue  # the notifying thread died meanwhile
                    return
                notif_id, _pid, _flags, nr = struct.unpack_from("<QIIi", buf)
                self.answered.append(nr)
                try:
                    fcntl.ioctl(fd, NOTIF_SEND, bytearray(struct.pack("<QqiI", notif_id, 0, 0, 0)), True)
                except OSError:
                    pass
        finally:
            os.close(fd)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)
        self.sock.close()


@pytest.fixture
def agent(tmp_path: Path):
    a = Agent(str(tmp_path / "agent.sock"))
    yield a
    a.close()
    assert not a.errors, a.errors


def _profile(agent_path: str, nnp: bool = True):
    def edit(c):
        c["process"]["noNewPrivileges"] = nnp
        c["linux"]["seccomp"] = {
            "defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64"],
            "listenerPath": agent_path, "listenerMetadata": "rtit-meta",
            "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_NOTIFY"}]}
        c["annotations"] = {"rtit.test": "notify"}
    return edit


@pytest.mark.parametrize("nnp", [True, False])
def test_agent_answers_the_containers_syscalls(husk, make_bundle, agent, nnp: bool) -> None:
    b = make_bundle(["sh", "-c", "mkdir /tmp/made; echo rc=$?; ls -A /tmp | wc -l"], edit=_profile(agent.path, nnp))
    cid = unique()
    cp = husk.run(b, cid)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split() == ["rc=0", "0"]  # mkdir "succeeded" (the agent said so) but made nothing
    assert set(agent.answered) & {NR_MKDIR, NR_MKDIRAT}
    rec = agent.records[0]
    assert rec["fds"] == ["seccompFd"] and rec["metadata"] == "rtit-meta"
    assert rec["state"]["id"] == cid and rec["state"]["status"] == "creating"
    assert rec["state"]["bundle"] == str(b) and rec["state"]["annotations"] == {"rtit.test": "notify"}
    assert rec["pid"] == rec["state"]["pid"] > 1


def test_exec_hands_its_own_listener_over(husk, make_bundle, agent) -> None:
    cid = unique()
    husk.run(make_bundle(["sleep", "1000"], edit=_profile(agent.path)), cid, "-d")
    init_pid = husk.state(cid)["pid"]
    cp = husk("exec", cid, "sh", "-c", "mkdir /tmp/x2; echo rc=$?; test -d /tmp/x2 && echo exists; echo $$",
              check=False, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split()[:1] == ["rc=0"] and "exists" not in cp.stdout
    assert len(agent.records) == 2  # the init's, then exec's
    rec = agent.records[1]
    assert rec["state"]["status"] == "running" and rec["state"]["pid"] == init_pid
    assert rec["pid"] != init_pid and os.path.exists(f"/proc/{rec['pid']}") is False  # exec's process, exited


def test_unreachable_listener_fails_create_cleanly(husk, make_bundle, tmp_path: Path) -> None:
    b = make_bundle(["true"], edit=_profile(str(tmp_path / "nobody.sock")))
    cid, cp = husk.create(b, check=False)
    assert cp.returncode == 1
    assert "listenerPath" in cp.stderr and "nobody.sock" in cp.stderr
    assert not (Path(husk.root) / cid).exists()


def test_notify_on_a_syscall_the_handoff_needs_is_a_config_error(husk, make_bundle, tmp_path: Path) -> None:
    def edit(c):
        _profile(str(tmp_path / "a.sock"))(c)
        c["linux"]["seccomp"]["syscalls"][0]["names"] = ["sendmsg"]
    cid, cp = husk.create(make_bundle(["true"], edit=edit), check=False)
    assert cp.returncode == 1
    assert "linux.seccomp.syscalls[0].names[0]" in cp.stderr and "sendmsg" in cp.stderr
    assert not (Path(husk.root) / cid).exists()
