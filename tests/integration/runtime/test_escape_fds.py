"""No host file descriptor reaches a container (the CVE-2024-21626 class): every fd but stdio and --preserve-fds
is closed before the container's program runs, and a working directory that resolves outside the container
(e.g. /proc/self/fd/N of a leaked directory fd) is refused instead of being entered.

The runtime is started with open, inheritable fds on host directories (as a careless caller would leave them);
the container lists its fds from the inside and the host checks /proc/<pid>/fd from the outside.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.integration.conftest import unique

pytestmark = pytest.mark.root

HOST_DIRS = ("/", "/etc", "/sys/fs/cgroup", "/proc", "/run")


def _leaky(husk, *args: str, fds: list[int], argv: list[str] | None = None) -> subprocess.CompletedProcess:
    """Runs husk with `fds` inherited (not close-on-exec), like a caller that forgot O_CLOEXEC. Output goes to
    files: a created container keeps its stdio open, a pipe would never reach EOF."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.run([*(argv or husk.argv), "--root", husk.root, *args], stdout=out, stderr=err,
                           pass_fds=fds, stdin=subprocess.DEVNULL, timeout=60)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(p.args, p.returncode, out.read().decode(), err.read().decode())


@pytest.fixture
def host_fds():
    fds = [os.open(d, os.O_RDONLY | os.O_DIRECTORY) for d in HOST_DIRS]
    fds.append(os.open("/etc/passwd", os.O_RDONLY))
    yield fds
    for fd in fds:
        os.close(fd)


def _fd_list(text: str) -> list[str]:
    return sorted(text.split(), key=int)


def test_run_closes_every_inherited_fd(husk, make_bundle, host_fds) -> None:
    # `ls` opens the directory it lists: exactly one fd beyond stdio, and it is ls's own
    b = make_bundle(["sh", "-c", "ls /proc/self/fd; echo ---; ls -l /proc/self/fd"])
    cid = unique()
    husk.created.append(cid)
    cp = _leaky(husk, "run", "--bundle", str(b), cid, fds=host_fds)
    assert cp.returncode == 0, cp.stderr
    names, _, details = cp.stdout.partition("---")
    assert _fd_list(names) == ["0", "1", "2", "3"], cp.stdout
    for d in HOST_DIRS:
        assert f"-> {d}\n" not in details


def test_created_and_running_container_holds_only_stdio(husk, make_bundle, host_fds) -> None:
    b = make_bundle(["sleep", "1000"])
    cid = unique()
    husk.created.append(cid)
    cp = _leaky(husk, "create", "--bundle", str(b), cid, fds=host_fds)
    assert cp.returncode == 0, cp.stderr
    pid = husk.state(cid)["pid"]
    # the waiting init (still the runtime) holds stdio and its listening start socket, nothing of the host
    held = {int(n): os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")}
    with open("/proc/net/unix") as f:  # the start socket was made in the runtime's (the host's) netns
        bound = {line.split()[6]: line.split()[7] for line in f if len(line.split()) == 8}
    assert set(held) - {0, 1, 2}, held
    for k, v in held.items():
        if k > 2:
            assert v.startswith("socket:[") and bound.get(v[8:-1], "").endswith(f"/{cid}/exec.sock"), (held, v)
    husk("start", cid)
    assert sorted(int(n) for n in os.listdir(f"/proc/{pid}/fd")) == [0, 1, 2]


def test_exec_closes_every_inherited_fd(husk, make_bundle, host_fds) -> None:
    cid = unique()
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    cp = _leaky(husk, "exec", cid, "ls", "/proc/self/fd", fds=host_fds)
    assert cp.returncode == 0, cp.stderr
    assert _fd_list(cp.stdout) == ["0", "1", "2", "3"]


def test_preserve_fds_keeps_exactly_those(husk, make_bundle, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.write_text("preserved\n")
    keep = os.open(data, os.O_RDONLY)
    other = os.open("/etc", os.O_RDONLY | os.O_DIRECTORY)

    try:
        b = make_bundle(["sh", "-c", "cat <&3; ls /proc/self/fd"])
        cid = unique()
        husk.created.append(cid)
        # bash puts them at 3 and 4 in the child: fds 3 and 4 of this (pytest) process are not ours to replace
        argv = ["bash", "-c", f'exec "$@" 3<&{keep} 4<&{other}', "bash", *husk.argv]
        cp = _leaky(husk, "run", "--preserve-fds", "1", "--bundle", str(b), cid, fds=[keep, other], argv=argv)
    finally:
        os.close(keep)
        os.close(other)
    assert cp.returncode == 0, cp.stderr
    first, rest = cp.stdout.split("\n", 1)
    assert first == "preserved"
    assert _fd_list(rest) == ["0", "1", "2", "3", "4"]  # 3 preserved, 4 is ls's own directory fd


@pytest.mark.parametrize("n", range(3, 12))
def test_create_refuses_a_cwd_through_a_leaked_fd(husk, make_bundle, host_fds, n: int) -> None:
    b = make_bundle(["pwd"], edit=lambda c: c["process"].update(cwd=f"/proc/self/fd/{n}"))
    cid = unique()
    husk.created.append(cid)
    cp = _leaky(husk, "run", "--bundle", str(b), cid, fds=host_fds)
    assert cp.returncode != 0
    assert "cwd" in cp.stderr, cp.stderr
    assert not (Path(husk.root) / cid).exists()


@pytest.mark.parametrize("n", range(3, 12))
def test_exec_refuses_a_cwd_through_a_leaked_fd(husk, make_bundle, host_fds, tmp_path: Path, n: int) -> None:
    cid = unique()
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    proc = {"args": ["sh", "-c", "pwd; ls"], "cwd": f"/proc/self/fd/{n}", "user": {"uid": 0, "gid": 0},
            "env": ["PATH=/bin"]}
    pf = tmp_path / "p.json"
    pf.write_text(json.dumps(proc))
    cp = _leaky(husk, "exec", "--process", str(pf), cid, fds=host_fds)
    assert cp.returncode != 0, cp.stdout
    assert "cwd" in cp.stderr, cp.stderr
    assert "passwd" not in cp.stdout and "shadow" not in cp.stdout
