"""Small pure pieces: ids, the JSON writer, cgroup path rules, mount options, the launcher, config semantics."""
from __future__ import annotations

import copy
import json

import pytest

from runtime import config, launcher, rootfs, state
from runtime.cgroups import resolve_path
from runtime.cgroups.v1 import device_rule
from runtime.errors import ConfigError, InvalidContainerId
from runtime.linux import syscalls as sc
from runtime.spec import default_spec


@pytest.mark.parametrize("cid", ["abc", "a.b-c_d+e", "x" * 1024, "0"])
def test_valid_ids(cid: str) -> None:
    state.validate_id(cid)


@pytest.mark.parametrize("cid", ["", ".", "..", "a/b", "/abs", "a b", "x" * 1025, "é", "a\0b"])
def test_invalid_ids(cid: str) -> None:
    with pytest.raises(InvalidContainerId):
        state.validate_id(cid)


@pytest.mark.parametrize("value", [
    {"a": 1, "b": [True, False, None], "c": "q\"uo\\te\n\t\x01é"}, [], {}, [{"x": {"y": [1, 2]}}], -5, 1.5, "",
])
def test_json_writer_matches_json(value: object) -> None:
    assert json.loads(state.dumps_json(value)) == value
    assert json.loads(state.dumps_json(value, indent=2)) == value
    assert state.dumps_json(value, indent=2) == json.dumps(value, indent=2, ensure_ascii=False)


def test_resolve_path_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.cgroups as cg
    monkeypatch.setattr(cg, "own_cgroup", lambda: "/parent")
    assert resolve_path("/abs/path", "id") == "/abs/path"
    assert resolve_path("rel/x", "id") == "/parent/rel/x"
    assert resolve_path(None, "id1") == "/parent/id1"
    assert resolve_path("", "id1") == "/parent/id1"
    with pytest.raises(ConfigError):
        resolve_path("system.slice:husk:id", "id")
    monkeypatch.setattr(cg, "own_cgroup", lambda: "/")
    assert resolve_path(None, "id1") == "/id1"


def test_device_rules() -> None:
    assert device_rule({"allow": False, "access": "rwm"}) == "a *:* rwm"
    assert device_rule({"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rw"}) == "c 1:3 rw"
    assert device_rule({"allow": True, "type": "b", "major": 8, "minor": -1}) == "b 8:* rwm"


def test_parse_mount_options() -> None:
    mo = rootfs.parse_options(["nosuid", "noexec", "ro", "rw", "rbind", "rprivate", "mode=755", "size=1m", "rro"])
    assert mo.flags & sc.MS_NOSUID and mo.flags & sc.MS_NOEXEC and not mo.flags & sc.MS_RDONLY
    assert mo.flags & sc.MS_BIND and mo.flags & sc.MS_REC
    assert mo.propagation == [sc.MS_PRIVATE | sc.MS_REC]
    assert mo.data == ["mode=755", "size=1m"]
    assert mo.attr_set == sc.MOUNT_ATTR_RDONLY


def test_launcher_render() -> None:
    text = launcher.render("/venv/bin/python", "/src", ["/venv/lib/site-packages", "/src"])
    assert text.startswith("#!/venv/bin/python -IS\n")
    assert "sys.path[0:0] = ['/src']" in text and "sys.path.extend(['/venv/lib/site-packages'])" in text
    compile(text, "launcher", "exec")


def _check(edit) -> None:
    cfg = copy.deepcopy(default_spec())
    edit(cfg)
    config.check(cfg, "/bundle", require_rootfs=False)


@pytest.mark.parametrize("edit,where", [
    (lambda c: c["linux"]["namespaces"].append({"type": "user"}), "linux.uidMappings"),
    (lambda c: c["linux"].update(uidMappings=[{"containerID": 0, "hostID": 1, "size": 1}]), "linux.uidMappings"),
    (lambda c: c["linux"]["namespaces"].append({"type": "uts"}), "linux.namespaces[5].type"),
    (lambda c: c["linux"]["namespaces"].append({"type": "cgroup", "path": "rel"}), "linux.namespaces[5].path"),
    (lambda c: c["process"].update(args=[]), "process.args"),
    (lambda c: c["process"].update(cwd="rel"), "process.cwd"),
    (lambda c: c["process"]["rlimits"].append({"type": "RLIMIT_NOFILE", "soft": 1, "hard": 1}),
     "process.rlimits[1].type"),
    (lambda c: c["process"]["rlimits"].append({"type": "RLIMIT_FOO", "soft": 1, "hard": 1}),
     "process.rlimits[1].type"),
    (lambda c: c["process"]["rlimits"].__setitem__(0, {"type": "RLIMIT_NOFILE", "soft": 9, "hard": 1}),
     "process.rlimits[0]"),
    (lambda c: c["process"]["capabilities"]["effective"].append("CAP_FOO"), "process.capabilities.effective[3]"),
    (lambda c: (c["linux"].update(sysctl={"net.ipv4.ip_forward": "1"}), c.pop("hostname"),
                c["linux"].update(namespaces=[{"type": "mount"}])), "linux.sysctl.net.ipv4.ip_forward"),
    (lambda c: c["linux"].update(maskedPaths=["proc"]), "linux.maskedPaths[0]"),
    (lambda c: c["linux"].update(devices=[{"path": "/dev/x", "type": "c"}]), "linux.devices[0]"),
    (lambda c: c["mounts"].append({"destination": "/a/../b", "type": "tmpfs"}), "mounts[7].destination"),
    (lambda c: c["mounts"].append({"destination": "/a", "type": "bind"}), "mounts[7].source"),
    # idmap without mappings of its own takes the container's user namespace's: there is none here
    (lambda c: c["mounts"].append({"destination": "/a", "type": "bind", "source": "/x", "options": ["idmap"]}),
     "mounts[7]"),
    (lambda c: c["mounts"].append({"destination": "/a", "type": "tmpfs", "options": ["idmap"],
                                   "uidMappings": [{"containerID": 0, "hostID": 1, "size": 1}],
                                   "gidMappings": [{"containerID": 0, "hostID": 1, "size": 1}]}), "mounts[7]"),
    (lambda c: c.update(annotations={"org.husk.rootfs.idmap": "true"}), "annotations.org.husk.rootfs.idmap"),
    (lambda c: c.update(hooks={"prestart": [{"path": "rel"}]}), "hooks.prestart[0].path"),
    (lambda c: c.pop("root"), "root"),
    (lambda c: c.pop("process"), "process"),
    (lambda c: c["linux"].update(cgroupsPath="/a/../b"), "linux.cgroupsPath"),
])
def test_semantic_errors_name_the_field(edit, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        _check(edit)
    assert info.value.path == where


def test_features_json() -> None:
    import subprocess
    import sys
    cp = subprocess.run([sys.executable, "-m", "runtime.cli", "features"], capture_output=True, text=True, check=True)
    f = json.loads(cp.stdout)
    assert f["ociVersionMin"] == "1.0.0" and "poststop" in f["hooks"] and "rbind" in f["mountOptions"]
    # containerd 2 gates idmapped volumes on this: true only with the checker and the kernel behind it
    assert f["linux"]["mountExtensions"]["idmap"]["enabled"] is True
    assert "idmap" in f["mountOptions"] and "ridmap" in f["mountOptions"]
    assert "CAP_SYS_ADMIN" in f["linux"]["capabilities"]
