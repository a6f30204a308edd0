"""The runtime's create-stage timings (runtime/stages.py): written only when the caller asked for them."""
from __future__ import annotations

import pytest

from runtime import stages

pytestmark = pytest.mark.root


def test_stages_are_written_when_asked(husk, make_bundle) -> None:
    def with_hook(cfg: dict) -> None:
        cfg.setdefault("hooks", {})["createContainer"] = [{"path": "/bin/true"}]
        cfg["hooks"]["createRuntime"] = [{"path": "/bin/true"}]
        cfg["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW",
                                   "syscalls": [{"names": ["mbind"], "action": "SCMP_ACT_ERRNO"}]}
    b = make_bundle(["sleep", "1000"], edit=with_hook)
    stages.request(str(b))
    cid, _ = husk.create(b)
    got = stages.read(str(b))
    names = [n for n, _, _ in got]
    for want in ("cgroups", "cgroup_apply", "seccomp", "namespaces", "rootfs", "hooks", "hooks_container",
                 "pivot_root"):
        assert want in names, names
    assert all(start > 1_600_000_000 * 10**9 and dur >= 0 for _, start, dur in got)
    husk("delete", "--force", cid)


def test_nothing_is_written_when_nobody_asked(husk, make_bundle) -> None:
    b = make_bundle(["sleep", "1000"])
    cid, _ = husk.create(b)
    assert not (b / stages.FILE).exists()
    husk("delete", "--force", cid)


def test_runc_leaves_the_request_empty(runc, make_bundle) -> None:
    b = make_bundle(["sleep", "1000"])
    stages.request(str(b))
    cid, _ = runc.create(b)
    assert stages.read(str(b)) == []
    runc("delete", "--force", cid)


def test_a_failed_create_keeps_the_stages_that_ran(husk, make_bundle) -> None:
    b = make_bundle(["/no/such/binary"])
    stages.request(str(b))
    cid, cp = husk.create(b, None, check=False)
    assert cp.returncode != 0 and "/no/such/binary" in cp.stderr
    names = [n for n, _, _ in stages.read(str(b))]
    assert "namespaces" in names and "rootfs" in names and "pivot_root" in names, names
