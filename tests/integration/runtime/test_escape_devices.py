"""The device cgroup denies what the config does not allow: root in the container with CAP_MKNOD (part of the
default set) can create a node for the host's disk, /dev/kmsg or /dev/mem, but cannot open it; allowing one
device (read-only) in linux.resources.devices makes exactly that one readable. Nothing here ever writes."""
from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.root


def _host_disk() -> tuple[int, int] | None:
    """major:minor of a real (non-loop, non-empty) block device of this host, if it has one."""
    for entry in sorted(os.listdir("/sys/dev/block")):
        major, minor = (int(x) for x in entry.split(":"))
        if major in (1, 7):  # ramdisks and loop devices
            continue
        try:
            with open(f"/sys/dev/block/{entry}/size") as f:
                if int(f.read()) > 0:
                    return major, minor
        except (OSError, ValueError):
            continue
    return None


def _run(husk, make_bundle, script: str, rules: list[dict]) -> str:
    def edit(c):
        c["process"]["capabilities"] = {k: ["CAP_MKNOD", "CAP_DAC_OVERRIDE", "CAP_SYS_RAWIO", "CAP_SYSLOG"]
                                        for k in ("bounding", "effective", "permitted")}
        c["linux"]["resources"]["devices"] = [{"allow": False, "access": "rwm"}, *rules]
        c["root"]["readonly"] = False
    cp = husk.run(make_bundle(["sh", "-c", script], edit=edit))
    assert cp.returncode == 0, cp.stderr
    return cp.stdout


def test_nodes_for_host_devices_cannot_be_opened(husk, make_bundle) -> None:
    disk = _host_disk() or (7, 0)
    script = (f"mknod /tmp/disk b {disk[0]} {disk[1]} && echo made; mknod /tmp/kmsg c 1 11; mknod /tmp/mem c 1 1; "
              "for d in disk kmsg mem; do (head -c 16 /tmp/$d | wc -c) 2>&1; done; "
              "echo ok > /dev/null && echo null-ok")
    out = _run(husk, make_bundle, script, [])
    assert out.startswith("made\n")  # creating the node is allowed (as runc: "b *:* m")...
    assert out.count("Operation not permitted") == 3, out  # ...using it is not
    assert "null-ok" in out  # the default devices still work


def test_an_allowed_device_is_usable_and_only_as_allowed(husk, make_bundle) -> None:
    # /dev/kmsg: a device outside the defaults that root can read here (the host's disks may not be readable
    # even by the host's root, so they cannot be the positive case)
    script = ("mknod /tmp/kmsg c 1 11; mknod /tmp/mem c 1 1; "
              "timeout 5 dd if=/tmp/kmsg bs=8192 count=1 2>/dev/null | wc -c; (head -c 16 /tmp/mem | wc -c) 2>&1; "
              # opening for writing must be refused by the cgroup before anything could be written
              "(exec 3>>/tmp/kmsg) 2>&1; echo end")
    rules = [{"allow": True, "type": "c", "major": 1, "minor": 11, "access": "r"}]
    out = _run(husk, make_bundle, script, rules)
    assert int(out.splitlines()[0]) > 0  # readable: allowed with "r"
    assert "/tmp/mem: Operation not permitted" in out  # not allowed at all
    assert "/tmp/kmsg: Operation not permitted" in out  # for writing: only "r" was allowed
    assert out.splitlines()[-1] == "end"
    out = _run(husk, make_bundle, script, [])
    assert out.splitlines()[0] == "0" and out.splitlines()[-1] == "end"  # without the rule: nothing read
