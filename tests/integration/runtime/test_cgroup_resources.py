"""linux.resources and linux.cgroupsPath through `husk run` on this host's cgroup v1 hierarchies, seen from
inside the container: blkio weight on BFQ, memory swap/OOM-killer/swappiness, a relative cgroups path."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.conftest import run_script

pytestmark = pytest.mark.root


BLKIO = "/sys/fs/cgroup/blkio"


def test_blkio_weight_falls_back_to_bfq(husk, make_bundle) -> None:
    # Kernels without CFQ have no blkio.weight: blkio.bfq.weight takes the value (runc does the same). A kernel
    # with neither (no BFQ scheduler built in or loaded) refuses the weight, as runc does, naming the field.
    def edit(c):
        c["linux"]["resources"].update(blockIO={"weight": 321})
    script = "cat /sys/fs/cgroup/blkio/blkio.bfq.weight 2>/dev/null || cat /sys/fs/cgroup/blkio/blkio.weight"
    if not any(os.path.exists(os.path.join(BLKIO, f)) for f in ("blkio.weight", "blkio.bfq.weight")):
        cp = husk.run(make_bundle(["sh", "-c", script], edit=edit))
        assert cp.returncode != 0
        assert "linux.resources.blockIO.weight" in cp.stderr and "blkio.bfq.weight" in cp.stderr, cp.stderr
        return
    text = run_script(husk, make_bundle, script, edit)
    assert text.split()[-1] == "321"


def test_memory_oom_killer_disable_and_swap(husk, make_bundle) -> None:
    def edit(c):
        c["linux"]["resources"]["memory"] = {"limit": 32 << 20, "swap": 64 << 20, "disableOOMKiller": True,
                                             "swappiness": 0}
    text = run_script(husk, make_bundle, "cd /sys/fs/cgroup/memory; grep oom_kill_disable memory.oom_control; "
                  "cat memory.memsw.limit_in_bytes memory.swappiness", edit)
    assert text.split() == ["oom_kill_disable", "1", str(64 << 20), "0"]


def test_relative_cgroups_path_is_under_our_own_cgroup(husk, make_bundle) -> None:
    from runtime.cgroups import own_cgroup
    rel = "rtit-rel/" + os.urandom(3).hex()
    b = make_bundle(["sh", "-c", "grep pids /proc/self/cgroup"], edit=lambda c: c["linux"].update(cgroupsPath=rel))
    cp = husk.run(b)
    assert cp.returncode == 0, cp.stderr
    expect = os.path.normpath(os.path.join(own_cgroup(), rel))
    assert cp.stdout.strip().endswith(":" + expect)
    for d in Path("/sys/fs/cgroup").glob("*" + os.path.dirname(expect)):
        try:
            d.rmdir()
        except OSError:
            pass
