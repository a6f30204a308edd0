"""A container without linux.seccomp costs nothing for seccomp: neither the runtime process of `create` and
`start` nor the stages it forks (the intermediate child, the init until its execve) import runtime.seccomp*,
and libseccomp is never loaded (root).

The stages run in other processes (the init even in another interpreter, re-exec'd from the protected one:
runtime/exeguard.py), out of reach of a sys.modules check. So husk runs in a wrapper that first calls
`exeguard.reexec_self()`, as a shim does, so that the stages are forks of the wrapper, and installs an audit
hook (inherited by forks) that writes every import of a runtime module and every dlopen to stderr, with its pid:
the init keeps stderr until its execve. A plain `husk create` is checked from the outside: its waiting init
maps no libseccomp.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.integration.conftest import TOP, unique

pytestmark = pytest.mark.root

WRAPPER = r"""
import os, sys
sys.path.insert(0, {top!r})
from runtime import exeguard
exeguard.reexec_self()  # returns in the re-exec'd copy: the stages are forks of this interpreter from now on


def hook(event, args):
    if event == "import" and str(args[0]).startswith("runtime"):
        os.write(2, f"AUDIT {{os.getpid()}} import {{args[0]}}\n".encode())
    elif event == "ctypes.dlopen":
        os.write(2, f"AUDIT {{os.getpid()}} dlopen {{args[0]}}\n".encode())


sys.addaudithook(hook)
os.write(2, f"WRAPPER {{os.getpid()}}\n".encode())
from runtime import cli
rc = cli.main(sys.argv[1:])
sys.stdout.flush()
os._exit(rc or 0)
"""

PROFILE = {"defaultAction": "SCMP_ACT_ALLOW",
           "syscalls": [{"names": ["keyctl"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]}


def _bundle(make_bundle, seccomp: bool) -> Path:
    def edit(c):
        c["linux"].pop("seccomp", None)
        if seccomp:
            c["linux"]["seccomp"] = PROFILE
    return make_bundle(["true"], edit=edit)


def _wrapped(husk, *args: str) -> tuple[int, list[tuple[int, str, str]]]:
    """Runs `husk --root R args` in the wrapper; returns its pid and the (pid, event, name) audit records of it
    and of every stage it forked."""
    code = WRAPPER.format(top=str(TOP))
    # files, not pipes: the created container's init keeps stderr until its execve
    with tempfile.TemporaryFile() as err:
        cp = subprocess.run([sys.executable, "-I", "-S", "-c", code, "--root", husk.root, *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, timeout=60)
        err.seek(0)
        text = err.read().decode(errors="replace")
    assert cp.returncode == 0, text
    wrapper = int(next(line.split()[1] for line in text.splitlines() if line.startswith("WRAPPER ")))
    records = []
    for line in text.splitlines():
        if line.startswith("AUDIT "):
            _, pid, event, name = line.split(" ", 3)
            records.append((int(pid), event, name))
    return wrapper, records


def _seccomp_records(records: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    return [r for r in records if "seccomp" in r[2]]


def test_create_and_start_without_a_profile_import_no_seccomp_module(husk, make_bundle) -> None:
    cid = unique()
    husk.created.append(cid)
    parent, created = _wrapped(husk, "create", "--bundle", str(_bundle(make_bundle, seccomp=False)), cid)
    # the hook saw the stages: the intermediate child and the init import what the runtime process does not
    assert {pid for pid, _, _ in created} - {parent}, created
    assert _seccomp_records(created) == []
    _, started = _wrapped(husk, "start", cid)
    assert _seccomp_records(started) == []
    assert started, "the start verb imported no runtime module at all: the hook did not run"


def test_the_check_sees_a_profile_being_prepared(husk, make_bundle) -> None:
    """The same check with linux.seccomp set: the runtime modules and libseccomp show up (the check can fail)."""
    cid = unique()
    husk.created.append(cid)
    _, created = _wrapped(husk, "create", "--bundle", str(_bundle(make_bundle, seccomp=True)), cid)
    names = {name for _, _, name in _seccomp_records(created)}
    assert "runtime.seccomp" in names and "runtime.seccomp_lib" in names, created
    assert any(event == "dlopen" and "libseccomp" in name for _, event, name in created), created


def _mapped_libseccomp(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return "libseccomp" in f.read()


@pytest.mark.parametrize("seccomp", [False, True], ids=["no-profile", "profile"])
def test_plain_create_maps_libseccomp_only_with_a_profile(husk, make_bundle, seccomp: bool) -> None:
    # `python -m runtime.cli`, unprotected: the init is a fresh interpreter re-exec'd from the protected one
    cid, _ = husk.create(_bundle(make_bundle, seccomp=seccomp))
    pid = husk.state(cid)["pid"]
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        assert f.read().rstrip(b"\0") == b"husk:[2:INIT]"  # still the runtime's stage, waiting on the exec fifo
    assert _mapped_libseccomp(pid) is seccomp
