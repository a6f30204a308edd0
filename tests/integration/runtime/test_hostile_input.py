"""Hostile input to `husk create`: each case is a clear error naming the problem, leaves nothing behind (state dir,
cgroup, mount, process) and leaves the host as it was."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.integration.conftest import unique

pytestmark = pytest.mark.root

WATCHED = ("/etc/passwd", "/etc/shadow", "/etc/hosts", "/etc/group")


class HostSnapshot:
    """What a failed create must not change: the watched files, / and /etc listings, and the mounts below the
    places the runtime works in (other jobs on this machine mount and unmount elsewhere meanwhile)."""

    def __init__(self, *places: str) -> None:
        self.places = tuple(os.path.realpath(p) for p in places)
        self.files = {p: self._digest(p) for p in WATCHED if os.path.exists(p)}
        self.root = sorted(os.listdir("/"))
        self.etc = sorted(os.listdir("/etc"))
        self.mounts = self._mounts()

    def _mounts(self) -> list[str]:
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
        return sorted(p for p in points if p in ("/", "/etc") or any(p.startswith(x) for x in self.places))

    @staticmethod
    def _digest(path: str) -> str:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()

    def changes(self) -> list[str]:
        now = HostSnapshot(*self.places)
        out = [f"{p} changed" for p in self.files if now.files.get(p) != self.files[p]]
        if now.root != self.root:
            out.append(f"/ changed: {set(now.root) ^ set(self.root)}")
        if now.etc != self.etc:
            out.append(f"/etc changed: {set(now.etc) ^ set(self.etc)}")
        if now.mounts != self.mounts:
            out.append("mount table changed")
        return out


def leftovers(husk, cid: str, cg: str, bundle: Path) -> list[str]:
    found = []
    if (Path(husk.root) / cid).exists():
        found.append("state dir")
    if cg:
        found += [f"cgroup {c}" for c in ("memory", "pids", "cpu", "devices", "freezer")
                  if os.path.exists(f"/sys/fs/cgroup/{c}{cg}")]
    prefix = str(bundle)
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        for link in ("root", "cwd"):
            try:
                if os.readlink(f"/proc/{pid}/{link}").startswith(prefix):
                    found.append(f"process {pid}")
            except OSError:
                pass
    return found


def _create(husk, bundle: Path, cid: str | None = None, *extra: str) -> tuple[str, subprocess.CompletedProcess]:
    return husk.create(bundle, cid or unique(), *extra, check=False)


def _expect_clean_failure(husk, make_bundle, needle: str, *, edit=None, prepare=None, cid: str | None = None,
                          extra: tuple[str, ...] = ()) -> str:
    b = make_bundle(["true"], edit=edit)
    cfg_text = (b / "config.json").read_text()
    cg = json.loads(cfg_text)["linux"]["cgroupsPath"]
    if prepare is not None:
        prepare(b)
    snap = HostSnapshot(str(b), husk.root)
    started = time.monotonic()
    cid, cp = _create(husk, b, cid, *extra)
    assert cp.returncode == 1, (cp.stdout, cp.stderr)
    assert needle in cp.stderr, cp.stderr
    assert "Traceback" not in cp.stderr
    assert cp.stderr.count("\n") <= 2  # one clear line, not a dump
    assert leftovers(husk, cid, cg, b) == []
    assert snap.changes() == []
    assert time.monotonic() - started < 30
    return cp.stderr


def test_rootfs_that_is_a_symlink_to_the_hosts_root(husk, make_bundle) -> None:
    def prepare(b: Path) -> None:
        os.rename(b / "rootfs", b / "real-rootfs")
        os.symlink("/", b / "rootfs")
    err = _expect_clean_failure(husk, make_bundle, "root.path", prepare=prepare)
    assert "symlink" in err and "resolves to /" in err


def test_rootfs_behind_a_symlinked_directory(husk, make_bundle) -> None:
    def prepare(b: Path) -> None:
        os.rename(b / "rootfs", b / "elsewhere")
        os.symlink("elsewhere", b / "via")
        cfg = json.loads((b / "config.json").read_text())
        cfg["root"]["path"] = "via"
        (b / "config.json").write_text(json.dumps(cfg))
    _expect_clean_failure(husk, make_bundle, "is reached through a symlink", prepare=prepare)


@pytest.mark.parametrize("dest", ["/../../etc", "/tmp/../../../etc/cron.d", "/a/../../b"])
def test_dotdot_in_a_mount_destination(husk, make_bundle, dest: str) -> None:
    def edit(c):
        c["mounts"].append({"destination": dest, "type": "tmpfs", "source": "tmpfs"})
    err = _expect_clean_failure(husk, make_bundle, "must not contain '..'", edit=edit)
    assert "mounts[" in err


def test_huge_config(husk, make_bundle) -> None:
    def prepare(b: Path) -> None:
        cfg = json.loads((b / "config.json").read_text())
        cfg["annotations"] = {f"rtit.pad.{i}": "x" * 1000 for i in range(17 * 1024)}  # ~17 MiB
        (b / "config.json").write_text(json.dumps(cfg))
    _expect_clean_failure(husk, make_bundle, "more than husk's limit", prepare=prepare)


def test_deeply_nested_config(husk, make_bundle) -> None:
    def prepare(b: Path) -> None:
        (b / "config.json").write_text('{"ociVersion": "1.0.2", "annotations": ' + "[" * 100000 + "]" * 100000 + "}")
    _expect_clean_failure(husk, make_bundle, "nested too deeply", prepare=prepare)


def test_config_json_that_is_a_fifo(husk, make_bundle) -> None:
    def prepare(b: Path) -> None:
        os.unlink(b / "config.json")
        os.mkfifo(b / "config.json")  # nobody ever writes: reading it naively would block forever
    _expect_clean_failure(husk, make_bundle, "is not a regular file", prepare=prepare)


def test_100k_env_vars_beyond_what_execve_takes(husk, make_bundle) -> None:
    def edit(c):
        c["process"]["env"] += [f"RTIT_VARIABLE_{i:06d}=some-value-{i:06d}" for i in range(100_000)]
    err = _expect_clean_failure(husk, make_bundle, "process.env: ", edit=edit)
    assert "100002 variables" in err and "could never start" in err


def test_100k_small_env_vars_that_fit_run(husk, make_bundle) -> None:
    def edit(c):
        c["process"]["env"] += [f"V{i}=" for i in range(100_000)]  # ~1.8 MB with the pointers: under 2 MiB
    cp = husk.run(make_bundle(["env"], edit=edit))  # not sh: busybox's shell hashes variables into 39 buckets
    assert cp.returncode == 0, cp.stderr
    assert sum(1 for line in cp.stdout.splitlines() if line.startswith("V")) == 100_000


def test_one_env_string_too_long_for_execve(husk, make_bundle) -> None:
    def edit(c):
        c["process"]["env"].append("BIG=" + "x" * (128 * 1024))
    _expect_clean_failure(husk, make_bundle, "execve takes at most", edit=edit)


def test_nul_in_an_argument(husk, make_bundle) -> None:
    def edit(c):
        c["process"]["args"] = ["sh", "-c", "echo a\u0000b"]
    _expect_clean_failure(husk, make_bundle, "process.args[2]: contains a NUL character", edit=edit)


@pytest.mark.parametrize("cid", ["../../etc", "../x", "/etc", "a/../../b", "..", ".", "x y", "x\ny", "é"])
def test_hostile_container_ids(husk, make_bundle, cid: str) -> None:
    b = make_bundle(["true"])
    snap = HostSnapshot(str(b), husk.root)
    root_listing = sorted(os.listdir(husk.root)) if os.path.exists(husk.root) else []
    cp = subprocess.run([*husk.argv, "--root", husk.root, "create", "--bundle", str(b), "--", cid],
                        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert cp.returncode != 0
    assert "invalid container id" in cp.stderr or "must not" in cp.stderr or "not allowed" in cp.stderr, cp.stderr
    assert (sorted(os.listdir(husk.root)) if os.path.exists(husk.root) else []) == root_listing
    assert snap.changes() == []
    assert not os.path.exists(os.path.join(husk.root, "..", "etc"))


@pytest.mark.parametrize("kind", ["regular file", "directory", "fifo", "missing", "dead socket"])
def test_console_socket_that_is_not_a_listening_socket(husk, make_bundle, kind: str) -> None:
    def edit(c):
        c["process"]["terminal"] = True
    holder = tempfile.mkdtemp(prefix="rtit-console-")
    path = os.path.join(holder, "console")
    try:
        if kind == "regular file":
            Path(path).write_text("")
        elif kind == "directory":
            os.mkdir(path)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "dead socket":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(path)
            s.close()  # bound, never listening
        needle = {"regular file": "is not a unix socket (it is a regular file)",
                  "directory": "is not a unix socket (it is a directory)",
                  "fifo": "is not a unix socket (it is a fifo)",
                  "missing": "No such file or directory",
                  "dead socket": "Connection refused"}[kind]
        _expect_clean_failure(husk, make_bundle, needle, edit=edit, extra=("--console-socket", path))
        if kind == "regular file":
            assert Path(path).read_text() == ""
    finally:
        import shutil
        shutil.rmtree(holder, ignore_errors=True)
