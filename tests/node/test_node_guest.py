"""The node guest itself (scripts/vm-test --node): systemd as PID 1 on cgroup v2 only, the job in a system
slice, the system bus, transient units."""
from __future__ import annotations

import subprocess
import uuid

import pytest

pytestmark = [pytest.mark.node, pytest.mark.root]


def _self_cgroup() -> str:
    with open("/proc/self/cgroup") as f:
        return f.read().strip()


def test_systemd_on_cgroup_v2_only() -> None:
    with open("/proc/self/mountinfo") as f:
        types = [line.split(" - ")[1].split()[0] for line in f]
    assert "cgroup" not in types and types.count("cgroup2") >= 1
    # one unified hierarchy: "0::/path", and the job runs as a service in system.slice
    assert _self_cgroup().startswith("0::/system.slice/husk-vm-job.service")
    state = subprocess.run(["systemctl", "is-system-running"], capture_output=True, text=True).stdout.strip()
    # the boot (husk-node.target) is over once the job runs (Type=exec)
    assert state in {"running", "degraded"}, state


def test_a_transient_scope_in_a_transient_slice() -> None:
    slice_ = f"husknodetest{uuid.uuid4().hex[:8]}.slice"   # no dash: a dash nests slices
    unit = f"husk-nodetest-{uuid.uuid4().hex[:8]}"
    out = subprocess.run(["systemd-run", "--scope", f"--unit={unit}", f"--slice={slice_}", "--quiet",
                          "cat", "/proc/self/cgroup"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"0::/{slice_}/{unit}.scope"
    subprocess.run(["systemctl", "stop", slice_], check=True, timeout=60)
