"""runtime.exeguard on its own: the detached read-only interpreter, the sealed memfd fallback, reexec_self, and the
persistent protected interpreter the `husk` launcher execs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

TOP = Path(__file__).resolve().parents[3]

PROBE = """
import errno, os, sys
sys.path.insert(0, {top!r})
from runtime import exeguard
from runtime.linux import syscalls as sc
if {fallback!r}:
    def refuse(*a, **k):
        raise OSError(errno.EPERM, "open_tree refused for the test")
    sc.open_tree = refuse
print("before", exeguard.is_protected(), flush=True)
exeguard.reexec_self()  # the re-run prints "before True" and goes on
print("after", exeguard.is_protected(), os.readlink("/proc/self/exe"))
try:
    os.open("/proc/self/exe", os.O_WRONLY | os.O_TRUNC)
    print("write OPENED")
except OSError as e:
    print("write", errno.errorcode[e.errno])
"""


def _run(fallback: bool) -> list[str]:
    code = PROBE.format(top=str(TOP), fallback=fallback)
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    return cp.stdout.splitlines()


def test_reexec_self_runs_from_a_detached_read_only_mount() -> None:
    lines = _run(fallback=False)
    assert lines[:2] == ["before False", "before True"]
    assert lines[2].startswith("after True ")
    assert lines[3] == "write EROFS"


def test_sealed_memfd_when_mounts_are_refused() -> None:
    lines = _run(fallback=True)
    assert lines[:2] == ["before False", "before True"]
    assert lines[2].startswith("after True /memfd:husk-interpreter")
    assert lines[3] in ("write EPERM", "write ETXTBSY")  # sealed (is_protected checked the seals); a private copy


def test_a_plain_process_is_not_protected() -> None:
    from runtime import exeguard
    assert exeguard.is_protected() is False


# --- the persistent protected interpreter (exeguard.ensure_persistent, exec'd by the `husk` launcher) ---------
PERSISTENT_PROBE = """
import errno, os, sys
sys.path.insert(0, {top!r})
from runtime import exeguard
print("protected", exeguard.is_protected(), os.readlink("/proc/self/exe"))
try:
    os.open("/proc/self/exe", os.O_WRONLY | os.O_TRUNC)
    print("write OPENED")
except OSError as e:
    print("write", errno.errorcode[e.errno])
"""


@pytest.fixture
def persistent(tmp_path: Path):
    """The persistent protected interpreter of this test's Python under a private root, removed afterwards."""
    from runtime import exeguard
    real = os.path.realpath(sys.executable)
    path = exeguard.persistent_path(real, str(tmp_path / "protected"))
    try:
        yield real, path
    finally:
        exeguard.remove_persistent(path)
        assert _mount_at(path) is None and not os.path.exists(os.path.dirname(os.path.dirname(path)))


def _mount_at(path: str):
    from runtime.mountinfo import mount_at
    return mount_at(path)


def test_persistent_interpreter_is_read_only_unbindable_and_protected(persistent) -> None:
    from runtime import exeguard
    real, path = persistent
    assert exeguard.ensure_persistent(real, path)
    m = _mount_at(path)
    assert m is not None and {"ro", "nosuid", "nodev"} <= set(m.options) and "unbindable" in m.optional
    assert "unbindable" in _mount_at(os.path.dirname(os.path.dirname(path))).optional
    assert exeguard.persistent_ok(path, real) and exeguard.recorded_interpreter(path) == real
    assert exeguard.ensure_persistent(real, path)  # idempotent: no second mount
    from runtime.mountinfo import read
    assert sum(1 for x in read() if x.point == path) == 1
    cp = subprocess.run([path, "-I", "-S", "-c", PERSISTENT_PROBE.format(top=str(TOP))], capture_output=True,
                        text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.splitlines() == [f"protected True {path}", "write EROFS"]
    # an rbind of a parent directory (what a container given that directory gets) does not carry it along
    dest = Path(path).parents[3] / "rbind-copy"
    dest.mkdir()
    from runtime.linux import syscalls as sc
    sc.mount(str(Path(path).parents[2]), str(dest), None, sc.MS_BIND | sc.MS_REC)
    try:
        copied = dest / Path(path).parents[1].name / "bin" / "python"
        assert copied.stat().st_ino != os.stat(real).st_ino  # the empty mount point, not the interpreter
    finally:
        sc.umount2(str(dest), sc.MNT_DETACH)


def test_a_plain_read_only_bind_of_the_interpreter_is_not_protected(tmp_path: Path) -> None:
    # read-only but bindable: a container given its directory would get a copy of its own to remount
    from runtime.linux import syscalls as sc
    from runtime import exeguard
    target = tmp_path / "python"
    target.write_bytes(b"")
    real = os.path.realpath(sys.executable)
    sc.mount(real, str(target), None, sc.MS_BIND)
    try:
        sc.mount(None, str(target), None, sc.MS_BIND | sc.MS_REMOUNT | sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV)
        cp = subprocess.run([str(target), "-I", "-S", "-c", PERSISTENT_PROBE.format(top=str(TOP))],
                            capture_output=True, text=True, timeout=60)
        assert cp.stdout.splitlines()[0].startswith("protected False"), cp.stdout + cp.stderr
        assert not exeguard.persistent_ok(str(target), real + ".missing")
    finally:
        sc.umount2(str(target), sc.MNT_DETACH)


def test_a_stale_persistent_interpreter_is_made_again(persistent, tmp_path: Path) -> None:
    import shutil
    from runtime import exeguard
    real, path = persistent
    copy = tmp_path / "python-copy"
    shutil.copy2(real, copy)
    assert exeguard.ensure_persistent(str(copy), path)
    assert not exeguard.persistent_ok(path, real)  # another file than the interpreter now is
    assert exeguard.ensure_persistent(real, path)
    assert exeguard.persistent_ok(path, real) and os.stat(path).st_ino == os.stat(real).st_ino
    from runtime.mountinfo import read
    assert sum(1 for x in read() if x.point == path) == 1
