"""`husk features` says what the code accepts: every listed item works in a config, unlisted ones are refused,
and the document has the runtime-spec features shape (the fields runc 1.1.5 prints, plus the newer ones)."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from runtime import config, features, rootfs
from runtime.errors import ConfigError

DOC = features.document()


def check(raw: dict) -> None:
    config.check(raw, "/nonexistent-bundle", require_rootfs=False)


def base() -> dict:
    return {"ociVersion": "1.2.0", "root": {"path": "rootfs"},
            "process": {"args": ["sh"], "cwd": "/", "user": {"uid": 0, "gid": 0}, "capabilities": {}},
            "linux": {"namespaces": [{"type": "mount"}]}}


def test_shape_follows_the_runtime_spec() -> None:
    assert set(DOC) >= {"ociVersionMin", "ociVersionMax", "hooks", "mountOptions", "linux", "annotations"}
    linux = DOC["linux"]
    assert set(linux) >= {"namespaces", "capabilities", "cgroup", "seccomp", "apparmor", "selinux", "intelRdt",
                          "mountExtensions"}
    assert set(linux["cgroup"]) == {"v1", "v2", "systemd", "systemdUser", "rdma"}
    assert all(isinstance(v, bool) for v in linux["cgroup"].values())
    if linux["seccomp"]["enabled"]:
        assert set(linux["seccomp"]) == {"enabled", "actions", "operators", "archs", "knownFlags", "supportedFlags"}
        assert set(linux["seccomp"]["supportedFlags"]) <= set(linux["seccomp"]["knownFlags"])
    assert isinstance(linux["mountExtensions"]["idmap"]["enabled"], bool)
    json.dumps(DOC)


@pytest.mark.skipif(shutil.which("runc") is None, reason="runc is not installed")
def test_has_every_field_runc_prints() -> None:
    runc = json.loads(subprocess.run(["runc", "features"], capture_output=True, text=True, check=True).stdout)

    def keys(d: dict, prefix: str = "") -> set[str]:
        out = set()
        for k, v in d.items():
            if prefix.endswith("annotations."):
                continue
            out.add(prefix + k)
            if isinstance(v, dict):
                out |= keys(v, prefix + k + ".")
        return out
    assert keys(runc) - {"annotations"} <= keys(DOC)


def test_oci_versions_are_accepted() -> None:
    for v in (DOC["ociVersionMin"], DOC["ociVersionMax"]):
        raw = base()
        raw["ociVersion"] = v
        check(raw)


def test_listed_namespaces_work_and_the_rest_are_refused() -> None:
    for kind in DOC["linux"]["namespaces"]:
        raw = base()
        if kind != "mount":
            raw["linux"]["namespaces"].append({"type": kind})
        if kind == "user":
            raw["linux"]["uidMappings"] = raw["linux"]["gidMappings"] = [{"containerID": 0, "hostID": 1, "size": 1}]
        check(raw)
    assert {"pid", "network", "ipc", "uts", "mount", "cgroup", "user"} <= set(DOC["linux"]["namespaces"])
    raw = base()
    raw["linux"]["namespaces"].append({"type": "fancy"})
    with pytest.raises(ConfigError):
        check(raw)


def test_listed_capabilities_are_accepted_in_every_set() -> None:
    caps = DOC["linux"]["capabilities"]
    assert "CAP_SYS_ADMIN" in caps and len(caps) == len(set(caps))
    raw = base()
    raw["process"]["capabilities"] = {k: list(caps) for k in config.CAP_SETS}
    check(raw)
    raw["process"]["capabilities"]["bounding"] = ["CAP_NOT_A_CAPABILITY"]
    with pytest.raises(ConfigError, match="unknown capability"):
        check(raw)


def test_listed_mount_options_are_understood_not_passed_as_data() -> None:
    for opt in DOC["mountOptions"]:
        mo = rootfs.parse_options([opt])
        assert mo.data == [], opt
    # filesystem data options are not claimed
    assert "size=64m" not in DOC["mountOptions"] and "mode=755" not in DOC["mountOptions"]
    assert rootfs.parse_options(["size=64m"]).data == ["size=64m"]


def test_hooks() -> None:
    raw = base()
    raw["hooks"] = {h: [{"path": "/bin/true"}] for h in DOC["hooks"]}
    check(raw)
    assert DOC["hooks"] == list(config.HOOK_KINDS)


def test_seccomp_actions_listed_iff_accepted() -> None:
    sec = DOC["linux"]["seccomp"]
    if not sec["enabled"]:
        pytest.skip("no seccomp here")
    from runtime import seccomp
    for action in seccomp.ACTIONS:
        raw = base()
        raw["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW",
                                   "syscalls": [{"names": ["uname"], "action": action}]}
        if action == "SCMP_ACT_NOTIFY":
            raw["linux"]["seccomp"]["listenerPath"] = "/run/x.sock"
        try:
            check(raw)
            ok = True
        except ConfigError:
            ok = False
        assert ok == (action in sec["actions"]), action
    for arch in sec["archs"]:
        raw = base()
        raw["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW", "architectures": [arch]}
        check(raw)
    for op in sec["operators"]:
        raw = base()
        raw["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
            {"names": ["uname"], "action": "SCMP_ACT_ERRNO", "args": [{"index": 0, "value": 1, "op": op}]}]}
        check(raw)
    for flag in sec["knownFlags"]:
        raw = base()
        raw["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW", "flags": [flag]}
        if flag == "SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV":
            continue  # valid only with a listener (checked with SCMP_ACT_NOTIFY)
        check(raw)


def test_refused_features_are_reported_disabled() -> None:
    raw = base()  # an idmapped mount needs both mappings
    raw["mounts"] = [{"destination": "/m", "type": "bind", "source": "/", "options": ["bind"],
                      "uidMappings": [{"containerID": 0, "hostID": 1, "size": 1}]}]
    with pytest.raises(ConfigError):
        check(raw)
    raw["mounts"][0]["gidMappings"] = raw["mounts"][0]["uidMappings"]
    check(raw)
    assert DOC["linux"]["mountExtensions"]["idmap"]["enabled"] is True
    raw = base()
    raw["linux"]["intelRdt"] = {"closID": "x"}
    with pytest.raises(ConfigError):
        check(raw)
    assert DOC["linux"]["intelRdt"]["enabled"] is False
    assert DOC["linux"]["cgroup"]["systemd"] is True      # --systemd-cgroup (runtime/cgroups/systemd.py)
    assert DOC["linux"]["cgroup"]["systemdUser"] is False
    with pytest.raises(ConfigError, match="systemd"):      # a slice path without --systemd-cgroup, as runc
        from runtime.cgroups import resolve_path
        resolve_path("system.slice:husk:abc", "abc")


def test_cli_prints_the_document() -> None:
    import sys
    out = subprocess.run([sys.executable, "-m", "runtime.cli", "features"], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == json.loads(json.dumps(DOC))


def test_document_lists_what_containerd_and_runc_users_check() -> None:
    assert DOC["ociVersionMin"] == "1.0.0" and "poststop" in DOC["hooks"] and "rbind" in DOC["mountOptions"]
    # containerd 2 gates idmapped volumes on this: true only with the checker and the kernel behind it
    assert DOC["linux"]["mountExtensions"]["idmap"]["enabled"] is True
    assert "idmap" in DOC["mountOptions"] and "ridmap" in DOC["mountOptions"]
    assert "CAP_SYS_ADMIN" in DOC["linux"]["capabilities"]
