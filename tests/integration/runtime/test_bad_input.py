"""Bad input: every case gets a clear error naming the problem and leaves nothing behind (no state dir,
cgroup, mount or process)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration import leftover
from tests.integration.conftest import unique

pytestmark = pytest.mark.root


def create_bad(husk, make_bundle, edit=None, raw: str | None = None):
    b = make_bundle(["true"], edit=edit)
    cg = json.loads((b / "config.json").read_text())["linux"]["cgroupsPath"]
    if raw is not None:
        (b / "config.json").write_text(raw)
    cid, cp = husk.create(b, check=False)
    assert cp.returncode == 1
    # state dir, cgroup dirs in every hierarchy, mounts under the bundle, processes in the cgroup or bundle
    assert leftover.leftovers(husk.root, cid, cg, b) == []
    return cp.stderr


def test_invalid_json(husk, make_bundle) -> None:
    err = create_bad(husk, make_bundle, raw='{"ociVersion": "1.0.2",')
    assert "invalid JSON" in err


@pytest.mark.parametrize("edit,path,why", [
    (lambda c: c.update(ociVersion=2), "ociVersion", "must be string"),
    (lambda c: c.update(ociVersion="2.0.0"), "ociVersion", "must match pattern"),
    (lambda c: c["linux"]["namespaces"].append({"type": "bogus"}), "linux.namespaces[5].type", "must be one of"),
    (lambda c: c["mounts"].append({"type": "tmpfs"}), "mounts[7]", "must contain ['destination']"),
    (lambda c: c["process"]["user"].update(uid=-1), "process.user.uid", "must be bigger than or equal to 0"),
    (lambda c: c["linux"].update(maskedPaths="/proc"), "linux.maskedPaths", "must be array"),
])
def test_schema_violation(husk, make_bundle, edit, path, why) -> None:
    err = create_bad(husk, make_bundle, edit)
    assert f"config.json: {path}: {why}" in err


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c["linux"]["namespaces"].append({"type": "user"}), "linux.uidMappings: a new user namespace needs"),
    (lambda c: c["linux"]["namespaces"].append({"type": "pid"}), "namespace 'pid' is listed twice"),
    (lambda c: c["process"].update(args=[]), "process.args: must have at least one entry"),
    (lambda c: c["process"]["capabilities"]["bounding"].append("CAP_NOPE"), "unknown capability 'CAP_NOPE'"),
    (lambda c: c["mounts"].append({"destination": "relative", "type": "tmpfs"}), "is not an absolute path"),
    (lambda c: c.update(hostname="x") or c["linux"].update(namespaces=[{"type": "mount"}]), "hostname: setting"),
    (lambda c: c["linux"].update(sysctl={"vm.swappiness": "1"}), "not a namespaced sysctl"),
])
def test_semantic_violation(husk, make_bundle, edit, needle) -> None:
    assert needle in create_bad(husk, make_bundle, edit)


@pytest.mark.parametrize("cid,why", [("a/b", "not allowed"), ("..", "must not be"), ("x" * 1025, "longer than"),
                                     ("a b", "not allowed")])
def test_bad_ids(husk, make_bundle, cid, why) -> None:
    b = make_bundle(["true"])
    cp = husk("create", "--bundle", str(b), cid, check=False)
    assert cp.returncode == 1 and "invalid container id" in cp.stderr and why in cp.stderr
    assert not os.path.exists(husk.root) or os.listdir(husk.root) == []


def test_missing_rootfs(husk, make_bundle) -> None:
    err = create_bad(husk, make_bundle, lambda c: c["root"].update(path="no-such-rootfs"))
    assert "root.path" in err and "does not exist" in err


def test_duplicate_id(husk, make_bundle) -> None:
    b = make_bundle(["true"])
    cid, _ = husk.create(b)
    _, cp = husk.create(b, cid, check=False)
    assert cp.returncode == 1 and "already exists" in cp.stderr
    assert husk.state(cid)["status"] == "created"


def test_systemd_cgroup_on_a_cgroup_v1_host_is_a_clear_error(husk, make_bundle) -> None:
    """husk's systemd driver is cgroup v2 only (tests/node/test_systemd_runtime.py runs it under systemd)."""
    from runtime.cgroups import is_unified
    if is_unified():
        pytest.skip("a cgroup v2 host: the systemd driver works here")
    b = make_bundle(["true"], edit=lambda c: c["linux"].__setitem__("cgroupsPath", "system.slice:husk:x"))
    cid = unique()
    husk.created.append(cid)
    cp = husk("--systemd-cgroup", "create", "--bundle", str(b), cid, check=False, stdin=subprocess.DEVNULL)
    assert cp.returncode == 1 and "cgroup v2" in cp.stderr and "--systemd-cgroup" in cp.stderr
    assert not os.path.exists(os.path.join(husk.root, cid))
    # and a slice path without the flag names the flag, as runc refuses it
    cp = husk("create", "--bundle", str(b), cid, check=False, stdin=subprocess.DEVNULL)
    assert cp.returncode == 1 and "--systemd-cgroup" in cp.stderr and "linux.cgroupsPath" in cp.stderr


def test_log_json_records_error(husk, tmp_path: Path) -> None:
    log = tmp_path / "log.json"
    cp = husk("--log", str(log), "--log-format", "json", "state", "nope", check=False)
    assert cp.returncode == 1
    rec = json.loads(log.read_text().splitlines()[-1])
    assert rec["level"] == "error" and "does not exist" in rec["msg"] and rec["time"]


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c["linux"]["resources"].update(hugepageLimits=[{"pageSize": "2MB", "limit": 1 << 21}]), "hugetlb"),
    (lambda c: c["linux"]["resources"].update(blockIO={"leafWeight": 500}), "blkio.leaf_weight"),
    (lambda c: c["linux"]["resources"].update(network={"classID": 5}), "net_cls"),
    (lambda c: c["linux"]["resources"].update(unified={"memory.max": "1000000"}), "cgroup v2"),
    (lambda c: c["process"].update(apparmorProfile="x"), "AppArmor is not enabled"),
])
def test_host_limits_are_clear_errors(husk, make_bundle, edit, needle) -> None:
    if needle == "AppArmor is not enabled" and os.path.isdir("/sys/kernel/security/apparmor"):
        pytest.skip("AppArmor is enabled here")
    b = make_bundle(["true"], edit=edit)
    cg = json.loads((b / "config.json").read_text())["linux"]["cgroupsPath"]
    cid, cp = husk.create(b, check=False)
    assert cp.returncode == 1 and needle in cp.stderr, cp.stderr
    assert not (Path(husk.root) / cid).exists()
    assert not os.path.exists(f"/sys/fs/cgroup/memory{cg}")


def test_unsupported_features_are_config_errors(husk, make_bundle) -> None:
    for edit, where in ((lambda c: c["linux"].update(netDevices={"eth1": {}}), "linux.netDevices"),
                        (lambda c: c["process"].update(scheduler={"policy": "SCHED_DEADLINE"}), "process.scheduler")):
        cid, cp = husk.create(make_bundle(["true"], edit=edit), check=False)
        assert cp.returncode == 1 and where in cp.stderr and "not" in cp.stderr
