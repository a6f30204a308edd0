"""A seccomp profile that blocks what the runtime needs around its start (close_range, getcwd) still starts the
container: bugs the OCI runtime-tools validation suite found, each pinned by a test that failed before the fix."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.root


@pytest.mark.parametrize("nnp", [False, True])
def test_profile_without_close_range_still_starts(husk, make_bundle, nnp: bool) -> None:
    """runtime-tools' default seccomp profile predates close_range(2): husk marks fds close-on-exec before the
    filter is loaded (without noNewPrivileges the filter goes in before the capabilities are dropped)."""
    def edit(c: dict) -> None:
        c["process"]["noNewPrivileges"] = nnp
        c["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW",
                                 "syscalls": [{"names": ["close_range"], "action": "SCMP_ACT_ERRNO"}]}
    cp = husk.run(make_bundle(["sh", "-c", "echo started"], edit=edit))
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == "started"


@pytest.mark.parametrize("nnp", [False, True])
def test_profile_refusing_getcwd_still_starts(husk, make_bundle, nnp: bool) -> None:
    """runtime-tools' linux_seccomp blocks getcwd: the cwd check (CVE-2024-21626 class) runs before the filter."""
    def edit(c: dict) -> None:
        c["process"]["noNewPrivileges"] = nnp
        c["process"]["cwd"] = "/tmp"
        c["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW",
                                 "syscalls": [{"names": ["getcwd"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]}
    cp = husk.run(make_bundle(["sh", "-c", "cd /; echo started"], edit=edit))
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == "started"
