"""create's cgroup placement on a v1/hybrid host without a write to cgroup.procs (which waits for an RCU grace
period): the intermediate child joins the v1 hierarchies itself (V1Manager.join_self) and forks the init into the
hybrid host's cgroup2 one (child.fork_init). The init must end up in the container's cgroup in every hierarchy,
as with the runtime's own apply, both through the protected re-exec and through the launcher."""
from __future__ import annotations

import json
import os

import pytest

from runtime import state as st
from runtime.cgroups import is_unified
from runtime.cgroups.v1 import hierarchies
from tests.integration.conftest import run_script
from tests.integration.runtime.test_escape_exe import launcher_husk  # noqa: F401 - a fixture

pytestmark = [pytest.mark.root, pytest.mark.skipif(is_unified(), reason="cgroup v1/hybrid host only")]


@pytest.fixture(params=["reexec", "launcher"])
def any_husk(request, husk):
    return husk if request.param == "reexec" else request.getfixturevalue("launcher_husk")


def _cgroups_of(pid: int) -> dict[str, str]:
    """controllers (or "unified" for the cgroup2 line) -> path, from /proc/<pid>/cgroup."""
    out = {}
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            hid, ctrls, path = line.rstrip("\n").split(":", 2)
            out["unified" if hid == "0" else ctrls] = path
    return out


def _cgroup_path(bundle) -> str:
    return json.loads((bundle / "config.json").read_text())["linux"]["cgroupsPath"]


def test_init_is_in_the_container_cgroup_in_every_hierarchy(any_husk, make_bundle) -> None:
    b = make_bundle(["true"])
    path = _cgroup_path(b)
    cid, _ = any_husk.create(b)
    pid = any_husk.state(cid)["pid"]
    got = _cgroups_of(pid)
    if "unified" in hierarchies():
        assert "unified" in got
    assert got and all(p == path for p in got.values()), got
    # create recorded the hierarchies it used, so the other verbs need not read the mount table
    assert st.load(any_husk.root, cid).cgroup_hier == hierarchies()
    any_husk("delete", "-f", cid)
    left = [mnt + path for mnt in hierarchies().values() if os.path.exists(mnt + path)]
    assert not left, left


def test_cgroup_namespace_container_is_placed_before_the_namespace(husk, make_bundle) -> None:
    """With a cgroup namespace the runtime applies every hierarchy before the child makes it (its root is
    the cgroup the child is in then): the container sees its cgroup as "/" in every hierarchy, cgroup2 too."""
    out = run_script(husk, make_bundle, "cat /proc/self/cgroup",
                     edit=lambda c: c["linux"]["namespaces"].append({"type": "cgroup"}))
    lines = [ln.split(":", 2) for ln in out.splitlines() if ln.count(":") >= 2]
    if "unified" in hierarchies():
        assert any(hid == "0" for hid, _, _ in lines), out
    assert lines and all(p == "/" for _, _, p in lines), out
