"""AppArmor and SELinux settings on a host that has neither (this one): a profile or process label that cannot be
applied is an error, as runc makes it, never a silently unconfined container; linux.mountLabel is ignored (as
crun; runc 1.1 passes it as a context= mount option and fails with EINVAL). The runc cases run runc itself."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runtime.config import selinux_enabled

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(os.path.isdir("/sys/kernel/security/apparmor") or selinux_enabled(),
                                 reason="this host has AppArmor or SELinux: these are the no-LSM behaviours")]

CASES = {
    "apparmor": (lambda c: c["process"].update(apparmorProfile="docker-default"), "apparmorProfile"),
    "selinux": (lambda c: c["process"].update(selinuxLabel="system_u:system_r:container_t:s0:c1,c2"),
                "selinuxLabel"),
}


def _bundle(make_bundle, edit):
    def full(c):
        c["ociVersion"] = "1.0.2-dev"  # what runc 1.1 knows
        edit(c)
    return make_bundle(["echo", "ran"], edit=full)


@pytest.mark.parametrize("case", sorted(CASES))
def test_unappliable_label_is_an_error_as_with_runc(husk, runc, make_bundle, case: str) -> None:
    edit, field = CASES[case]
    b = _bundle(make_bundle, edit)
    cp = runc.run(b)
    assert cp.returncode != 0 and "ran" not in cp.stdout  # the reference refuses too
    cg = json.loads((b / "config.json").read_text())["linux"]["cgroupsPath"]
    cid, cp = husk.create(b, check=False)
    assert cp.returncode == 1 and "ran" not in cp.stdout
    assert f"process.{field}" in cp.stderr and "not" in cp.stderr, cp.stderr
    assert not (Path(husk.root) / cid).exists()
    assert not any(os.path.exists(f"/sys/fs/cgroup/{c}{cg}") for c in ("memory", "pids", "devices"))


def test_selinux_label_on_exec_is_an_error(husk, make_bundle, tmp_path: Path) -> None:
    cid = "rtit-lsm-" + os.urandom(3).hex()
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    proc = {"args": ["true"], "cwd": "/", "user": {"uid": 0, "gid": 0}, "selinuxLabel": "system_u:system_r:x:s0"}
    pf = tmp_path / "p.json"
    pf.write_text(json.dumps(proc))
    cp = husk("exec", "--process", str(pf), cid, check=False)
    assert cp.returncode == 255 and "process.selinuxLabel" in cp.stderr  # runc: "exec failed: ...", 255


def test_mount_label_is_ignored_without_selinux(husk, make_bundle) -> None:
    def edit(c):
        c["ociVersion"] = "1.0.2-dev"
        c["linux"]["mountLabel"] = "system_u:object_r:container_file_t:s0:c1,c2"
    cp = husk.run(make_bundle(["sh", "-c", "echo ran; grep -c context= /proc/self/mountinfo"], edit=edit))
    assert cp.returncode == 1 and cp.stdout.split() == ["ran", "0"], cp.stderr  # grep found nothing: rc 1
