"""Mount points whose names mountinfo escapes (space -> \\040, tab -> \\011), seen through the real mount table:
the runtime's lookups compare unescaped paths. Runs in a private mount namespace (`unshare -m`): nothing
reaches the host's table, and the namespace goes away with the child even if a check fails."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")
TOP = Path(__file__).resolve().parents[3]

CHECK = r"""
import os, sys
from runtime import cgroups, mountinfo, rootfs
from runtime.linux import syscalls as sc
base = sys.argv[1]
proc, cg, shared = base + "/my proc", base + "/cg 2", base + "/tab\tshared"
for d in (proc, cg, shared):
    os.makedirs(d)
sc.mount("proc", proc, "proc", 0, None)
sc.mount("cgroup2", cg, "cgroup2", 0, None)
sc.mount("tmpfs", shared, "tmpfs", 0, None)
sc.mount(None, shared, None, sc.MS_SHARED, None)
os.makedirs(shared + "/rootfs")
print("procfs", rootfs._is_procfs(proc + "/self"))              # a bind source on /proc
print("cgroup2", cgroups.is_unified(cg))                         # the cgroup2 check of a root path
rootfs._make_parent_private(shared + "/rootfs")                  # pivot_root's parent must not be shared
print("private", not mountinfo.mount_at(shared).shared)
"""


def test_lookups_compare_unescaped_mount_points(tmp_path: Path) -> None:
    # failed before (each line): rootfs._is_procfs and cgroups._mount_type compared the escaped field, and
    # _make_parent_private unescaped only \040, so each found the parent mount instead
    cp = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", CHECK, str(tmp_path)],
                        capture_output=True, text=True, cwd=TOP, timeout=30)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split("\n")[:3] == ["procfs True", "cgroup2 True", "private True"]
