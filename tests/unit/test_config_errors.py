"""runtime.config.check's semantic errors name the field (ConfigError.path) that is wrong."""
from __future__ import annotations

import copy

import pytest

from runtime import config
from runtime.errors import ConfigError
from runtime.spec import default_spec


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
