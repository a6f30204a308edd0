"""The default profile is a valid OCI object for the reference runtimes: runc and crun load it, and inside
their containers the blocked syscalls fail with EPERM while ordinary programs run. The same bundle is
the one to run through husk once its runtime lands."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest

from runtime import seccomp

BUSYBOX = "/usr/bin/busybox"
SCRIPT = ("unshare -u true 2>&1; echo unshare=$?; "
          "echo hello > /tmp/x && cat /tmp/x; "
          "ls / >/dev/null; echo ls=$?")

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(not os.path.exists(BUSYBOX), reason="needs busybox-static")]


def _bundle(tmp_path, profile: dict) -> str:
    bundle = tmp_path / "bundle"
    rootfs = bundle / "rootfs"
    for d in ("bin", "tmp", "proc", "dev", "sys"):
        (rootfs / d).mkdir(parents=True)
    shutil.copy(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in ("sh", "unshare", "true", "echo", "cat", "ls"):
        os.symlink("busybox", rootfs / "bin" / applet)
    subprocess.run(["runc", "spec"], cwd=bundle, check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["terminal"] = False
    config["process"]["args"] = ["/bin/sh", "-c", SCRIPT]
    config["root"]["readonly"] = False
    config["linux"]["seccomp"] = profile
    (bundle / "config.json").write_text(json.dumps(config))
    return str(bundle)


def _command(runtime_bin: str) -> list[str]:
    if runtime_bin == "crun":
        # crun 1.8 refuses hybrid cgroup hosts whose cgroup2 mount exists; hide it in a private mount namespace.
        return ["unshare", "-m", "--propagation", "private", "sh", "-c",
                'umount /sys/fs/cgroup/unified 2>/dev/null; exec crun "$@"', "crun"]
    return [runtime_bin]


@pytest.mark.parametrize("runtime_bin", ["runc", "crun"])
def test_reference_runtimes_enforce_the_default_profile(tmp_path, runtime_bin: str) -> None:
    if shutil.which(runtime_bin) is None:
        pytest.skip(f"{runtime_bin} is not installed")
    profile = seccomp.default_profile(["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"])
    seccomp.validate(profile)
    bundle = _bundle(tmp_path, profile)
    state_root = str(tmp_path / "state")
    cid = f"husk-seccomp-{uuid.uuid4().hex[:12]}"
    try:
        out = subprocess.run([*_command(runtime_bin), "--root", state_root, "run", "--bundle", bundle, cid],
                             capture_output=True, text=True, timeout=60, check=False)
    finally:
        subprocess.run([*_command(runtime_bin), "--root", state_root, "delete", "--force", cid],
                       capture_output=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "Operation not permitted" in out.stdout
    assert "unshare=0" not in out.stdout
    assert "hello" in out.stdout and "ls=0" in out.stdout
