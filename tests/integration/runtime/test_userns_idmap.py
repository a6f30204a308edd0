"""Idmapped mounts (runtime/idmap.py): the rootfs (annotation org.husk.rootfs.idmap) and bind mounts with the
`idmap`/`ridmap` options or their own uidMappings/gidMappings, seen through the user namespace's mappings.

An idmapped mount with mapping "0 100000 65536" shows a file stored with uid 0 as host uid 100000, which is root
inside a container whose user namespace has that same mapping; a file container root creates is stored as uid 0.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.integration.conftest import unique
from tests.support.waiting import wait_for

pytestmark = pytest.mark.root

HOST_ID = 100000
MAP = [{"containerID": 0, "hostID": HOST_ID, "size": 65536}]


def _userns(c: dict) -> None:
    c["linux"]["namespaces"].append({"type": "user"})
    c["linux"]["uidMappings"] = MAP
    c["linux"]["gidMappings"] = MAP
    # the v1 cgroup tree cannot be mounted from a user namespace that owns no cgroup namespace
    c["mounts"] = [m for m in c["mounts"] if m["destination"] != "/sys/fs/cgroup"]
    c["root"]["readonly"] = False


def _public(public: Path, bundle: Path) -> Path:
    """The bundle moved where the container's ids can reach it (pytest's tmp dirs are 0700 root); its files stay
    owned by host root, as an image's are."""
    dest = public / bundle.name
    shutil.move(str(bundle), dest)
    return dest


def test_idmapped_rootfs_shows_host_root_files_as_container_root(husk, make_bundle, public_dir: Path) -> None:
    def edit(c):
        _userns(c)
        c.setdefault("annotations", {})["org.husk.rootfs.idmap"] = "true"
    b = _public(public_dir, make_bundle(["sh", "-c", "stat -c %u:%g /bin; touch /made-inside; "
                                                     "stat -c %u /made-inside; cat /proc/self/uid_map; sleep 1000"],
                                        edit=edit))
    cid = unique()
    cp = husk.run(b, cid, "-d")
    assert cp.returncode == 0, cp.stderr
    pid = husk.state(cid)["pid"]
    made = b / "rootfs" / "made-inside"
    wait_for(made.exists, timeout=10, what="the container's file")
    # stored as the container's root (0), seen by the container's processes (and through its root) as the mapped id
    assert made.stat().st_uid == 0
    wait_for(lambda: Path(f"/proc/{pid}/root/made-inside").stat().st_uid == HOST_ID, timeout=5,
             what="the file through the container's idmapped root")
    husk("kill", cid, "KILL")


def test_without_the_annotation_the_rootfs_is_not_idmapped(husk, make_bundle, public_dir: Path) -> None:
    b = _public(public_dir, make_bundle(["stat", "-c", "%u", "/bin"], edit=_userns))
    cp = husk.run(b)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split() == ["65534"]  # host root's directory: an unmapped id inside


def test_idmap_option_maps_a_volume_with_the_container_mappings(husk, make_bundle, public_dir: Path) -> None:
    vol = public_dir / "vol"
    vol.mkdir()
    (vol / "hosts").write_text("by host root\n")
    other = public_dir / "other"  # the same kind of directory, bound without idmap: host root's, out of reach
    other.mkdir()

    def edit(c):
        _userns(c)
        c["mounts"].append({"destination": "/vol", "type": "bind", "source": str(vol), "options": ["rbind", "idmap"]})
        c["mounts"].append({"destination": "/other", "type": "bind", "source": str(other), "options": ["rbind"]})
    b = _public(public_dir, make_bundle(["sh", "-c", "stat -c %u /vol/hosts; echo more >> /vol/hosts && "
                                                     "touch /vol/new && echo wrote; "
                                                     "(touch /other/new) 2>&1; echo end"], edit=edit))
    for d in ("vol", "other"):  # container root cannot create them in host root's (not idmapped) rootfs
        (b / "rootfs" / d).mkdir()
    cp = husk.run(b)
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    assert lines[0] == "0" and lines[1] == "wrote"
    assert "Permission denied" in lines[2]
    assert (vol / "hosts").read_text() == "by host root\nmore\n"
    assert (vol / "new").stat().st_uid == 0  # container root's file, stored as the id it has in the mount
    assert not (other / "new").exists()


def test_a_mount_with_its_own_mappings_needs_no_user_namespace(husk, make_bundle, public_dir: Path) -> None:
    vol = public_dir / "vol"
    vol.mkdir()
    (vol / "f").write_text("x")
    os.chown(vol / "f", 1000, 1000)

    def edit(c):
        c["mounts"].append({"destination": "/vol", "type": "bind", "source": str(vol), "options": ["bind"],
                            "uidMappings": [{"containerID": 1000, "hostID": 2000, "size": 10}],
                            "gidMappings": [{"containerID": 1000, "hostID": 3000, "size": 10}]})
    cp = husk.run(make_bundle(["stat", "-c", "%u:%g", "/vol/f"], edit=edit))
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split() == ["2000:3000"]


def test_a_filesystem_the_kernel_cannot_idmap_is_a_clear_error(husk, make_bundle, public_dir: Path) -> None:
    def edit(c):
        _userns(c)
        c["mounts"].append({"destination": "/hostsys", "type": "bind", "source": "/sys/kernel",
                            "options": ["bind", "idmap"]})
    b = _public(public_dir, make_bundle(["true"], edit=edit))
    cid, cp = husk.create(b, check=False)
    assert cp.returncode != 0
    assert "mounts[" in cp.stderr and "/hostsys" in cp.stderr and "cannot idmap" in cp.stderr and "sysfs" in cp.stderr
    assert husk("state", cid, check=False).returncode != 0  # nothing left behind


def test_features_report_idmap(husk) -> None:
    import json
    f = json.loads(husk("features").stdout)
    assert f["linux"]["mountExtensions"]["idmap"]["enabled"] is True
