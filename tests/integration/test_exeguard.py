"""runtime.exeguard on its own: the detached read-only interpreter, the sealed memfd fallback, reexec_self."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

TOP = Path(__file__).resolve().parents[2]

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
