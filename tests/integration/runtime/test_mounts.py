"""Mounts as the container sees them: rootfs propagation, bind mounts of files and directories (ro, rbind),
a shared volume under a shared root, the cgroup2 mount type."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import run_script

pytestmark = pytest.mark.root


@pytest.mark.parametrize("prop,want", [("private", ""), ("slave", "master:"), ("shared", "shared:"),
                                       ("unbindable", "unbindable")])
def test_rootfs_propagation(husk, make_bundle, prop: str, want: str) -> None:
    def edit(c):
        c["linux"]["rootfsPropagation"] = prop
    text = run_script(husk, make_bundle, "awk '$5 == \"/\" {print}' /proc/self/mountinfo", edit)
    optional = text.split(" - ")[0].split()[6:]
    if prop == "slave" and not _host_root_shared():
        want = ""  # a copy of a private mount has no master to be a slave of
    if want:
        assert any(o.startswith(want) for o in optional), (prop, text)
    else:
        assert optional == [], text


def _host_root_shared() -> bool:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split(" - ")[0].split()
            if fields[4] == "/":
                root = fields
    return any(o.startswith("shared:") for o in root[6:])


def test_shared_rootfs_keeps_a_bidirectional_volume_shared(husk, make_bundle, tmp_path: Path) -> None:
    """rootfsPropagation shared + an rshared bind of a shared host mount: a mount made inside the container
    appears on the host (critest's "mount with 'rshared'"); before, the root was made private first and the
    volume lost its peer."""
    vol = tmp_path / "vol"
    (vol / "sub").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(vol), str(vol)], check=True)
    try:
        subprocess.run(["mount", "--make-shared", str(vol)], check=True)

        def edit(c):
            c["linux"]["rootfsPropagation"] = "shared"
            c["mounts"].append({"destination": "/vol", "type": "bind", "source": str(vol),
                                "options": ["rbind", "rshared"]})
            for key in ("bounding", "effective", "permitted"):
                c["process"]["capabilities"][key] = sorted(set(c["process"]["capabilities"][key]) | {"CAP_SYS_ADMIN"})
        run_script(husk, make_bundle, "mount -t tmpfs husk-prop-test /vol/sub", edit)
        with open("/proc/self/mountinfo") as f:
            assert any(line.split()[4] == str(vol / "sub") for line in f), "the container's mount did not reach the host"
    finally:
        subprocess.run(["umount", "-R", str(vol)], check=False)


def test_bind_mounts_file_dir_readonly_and_rbind(husk, make_bundle, tmp_path: Path) -> None:
    src = tmp_path / "share"
    (src / "sub").mkdir(parents=True)
    (src / "hello.txt").write_text("hi from the host\n")
    single = tmp_path / "single.conf"
    single.write_text("one file\n")

    def edit(c):
        c["mounts"] += [
            {"destination": "/mnt/share", "type": "bind", "source": str(src), "options": ["rbind", "ro"]},
            {"destination": "/etc/single.conf", "type": "bind", "source": str(single), "options": ["bind"]},
            {"destination": "/mnt/rw", "type": "none", "source": str(src / "sub"), "options": ["rbind", "rw"]},
        ]
    text = run_script(husk, make_bundle, "cat /mnt/share/hello.txt /etc/single.conf; touch /mnt/share/x 2>&1; "
                  "echo made > /mnt/rw/new && echo rwok; grep -E ' /mnt/(share|rw) ' /proc/self/mountinfo", edit)
    assert "hi from the host" in text and "one file" in text
    assert "Read-only file system" in text and "rwok" in text
    assert (src / "sub" / "new").read_text() == "made\n"
    share = [line for line in text.splitlines() if " /mnt/share " in line][0]
    assert share.split()[5].startswith("ro")


def test_cgroup2_mount_type(husk, make_bundle) -> None:
    def edit(c):
        c["mounts"].append({"destination": "/mnt/unified", "type": "cgroup2", "source": "cgroup2",
                            "options": ["nosuid", "noexec", "nodev", "ro"]})
        c["linux"]["namespaces"].append({"type": "cgroup"})
    text = run_script(husk, make_bundle, "grep /mnt/unified /proc/self/mountinfo; ls /mnt/unified | grep -c cgroup.procs",
                  edit)
    assert "cgroup2" in text and text.split()[-1] == "1"
