"""Seccomp inside real husk containers: the program is prepared on the host side (cache, libseccomp) before
pivot_root and loaded last; blocked syscalls fail with EPERM, allowed ones work, exec'd processes are filtered."""
from __future__ import annotations

import subprocess
import sys

import pytest

from runtime.seccomp import default_profile

pytestmark = pytest.mark.root

PROBE = ("grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; "
         "unshare -n true 2>&1 && echo unshare-ok; "
         "mount -t tmpfs none /tmp 2>&1 && echo mount-ok; "
         "echo alive")


def _with_profile(nnp: bool):
    def edit(cfg):
        cfg["linux"]["seccomp"] = default_profile()
        cfg["process"]["noNewPrivileges"] = nnp
        # mount and unshare are refused by seccomp first; give the capability so EPERM can only come from it
        for key in ("bounding", "effective", "permitted"):
            cfg["process"]["capabilities"][key] = sorted(set(cfg["process"]["capabilities"][key]) | {"CAP_SYS_ADMIN"})
    return edit


@pytest.mark.parametrize("nnp", [True, False])
def test_default_profile_blocks_inside_the_container(husk, make_bundle, nnp: bool) -> None:
    cp = husk.run(make_bundle(["sh", "-c", PROBE], edit=_with_profile(nnp)))
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout
    assert "Seccomp:\t2" in out
    assert f"NoNewPrivs:\t{1 if nnp else 0}" in out
    assert "unshare-ok" not in out and "mount-ok" not in out
    assert "unshare(0x40000000): Operation not permitted" in out
    assert "mount: permission denied" in out  # busybox's words for EPERM
    assert out.rstrip().endswith("alive")


def test_without_a_profile_the_same_calls_work(husk, make_bundle) -> None:
    def edit(cfg):
        for key in ("bounding", "effective", "permitted"):
            cfg["process"]["capabilities"][key] = sorted(set(cfg["process"]["capabilities"][key]) | {"CAP_SYS_ADMIN"})
    cp = husk.run(make_bundle(["sh", "-c", PROBE], edit=edit))
    assert cp.returncode == 0, cp.stderr
    assert "Seccomp:\t0" in cp.stdout
    assert "unshare-ok" in cp.stdout and "mount-ok" in cp.stdout


def test_exec_is_filtered_too(husk, make_bundle) -> None:
    bundle = make_bundle(["sleep", "30"], edit=_with_profile(True))
    cid, _ = husk.create(bundle)
    husk("start", cid)
    cp = husk("exec", cid, "sh", "-c", PROBE, check=False, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    assert "Seccomp:\t2" in cp.stdout
    assert "unshare-ok" not in cp.stdout and "mount-ok" not in cp.stdout
    husk("kill", cid, "KILL")
