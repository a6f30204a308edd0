"""Hostile rootfs contents against the mount set-up: every symlink in a mount destination is resolved inside the
rootfs (as if it were "/"), /proc magic links are refused, a symlink swapped in and out while containers are
created (the CVE-2021-30465 class) never makes the runtime create or mount anything outside the rootfs; masked
paths are masked, read-only paths read-only, and /proc and /sys are nosuid,nodev,noexec whatever the config says.
"""
from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import pytest

from tests.integration.conftest import unique

pytestmark = pytest.mark.root


def _mountinfo() -> str:
    with open("/proc/self/mountinfo") as f:
        return f.read()


def _host_marker() -> Path:
    """A host path that must never come to exist (the runtime would have followed a symlink out)."""
    return Path("/tmp") / f"rtit-escape-{uuid.uuid4().hex[:10]}"


def test_absolute_symlink_destination_is_resolved_inside_the_rootfs(husk, make_bundle, tmp_path: Path) -> None:
    host_dir = tmp_path / "host-dir"  # exists on the host: a naive runtime would mount on it
    host_dir.mkdir()
    (host_dir / "keep").write_text("host data\n")
    marker = _host_marker()

    def edit(c):
        c["mounts"] += [{"destination": "/evil", "type": "tmpfs", "source": "tmpfs"},
                        {"destination": "/missing/x", "type": "tmpfs", "source": "tmpfs"}]
    b = make_bundle(["sh", "-c", f"echo inside > /evil/new && ls /evil; grep -c ' {marker}/x ' /proc/self/mountinfo"],
                    edit=edit)
    os.symlink(str(host_dir), b / "rootfs" / "evil")
    os.symlink(str(marker), b / "rootfs" / "missing")  # dangling: its target is created inside the rootfs
    cp = husk.run(b)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split() == ["new", "1"]  # the tmpfs, not the host directory's "keep"
    assert sorted(os.listdir(host_dir)) == ["keep"]
    assert not marker.exists()
    assert (b / "rootfs" / str(marker).lstrip("/") / "x").is_dir()
    assert (b / "rootfs" / str(host_dir).lstrip("/")).is_dir()  # the rooted twin of the host path
    assert str(host_dir) not in _mountinfo() and str(marker) not in _mountinfo()


def test_dotdot_symlink_is_clamped_at_the_rootfs(husk, make_bundle) -> None:
    name = f"rtit-up-{uuid.uuid4().hex[:8]}"

    def edit(c):
        c["mounts"].append({"destination": f"/up/{name}", "type": "tmpfs", "source": "tmpfs"})
    b = make_bundle(["true"], edit=edit)
    os.symlink("../../../../../..", b / "rootfs" / "up")
    cp = husk.run(b)
    assert cp.returncode == 0, cp.stderr
    assert not Path("/", name).exists()
    assert (b / "rootfs" / name).is_dir()


def test_file_bind_onto_a_symlink_to_a_host_file(husk, make_bundle, tmp_path: Path) -> None:
    src = tmp_path / "hosts"
    src.write_text("127.0.0.1 bound\n")
    with open("/etc/passwd", "rb") as f:
        before = hashlib.sha256(f.read()).hexdigest()

    def edit(c):
        c["mounts"].append({"destination": "/etc/hosts", "type": "bind", "source": str(src), "options": ["rbind"]})
    b = make_bundle(["cat", "/etc/hosts"], edit=edit)
    os.symlink("/etc/passwd", b / "rootfs" / "etc" / "hosts")  # the container's own /etc/passwd, rooted
    cp = husk.run(b)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == "127.0.0.1 bound\n"
    with open("/etc/passwd", "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == before


def test_proc_magic_link_destination_is_refused(husk, make_bundle) -> None:
    def edit(c):
        c["mounts"].append({"destination": "/proc/self/root/rtit-x", "type": "tmpfs", "source": "tmpfs"})
    b = make_bundle(["true"], edit=edit)
    cid, cp = husk.create(b, check=False)
    assert cp.returncode == 1
    assert "magic link" in cp.stderr and "/proc/self/root/rtit-x" in cp.stderr
    assert not (Path(husk.root) / cid).exists()
    assert not Path("/rtit-x").exists()


def test_proc_destination_symlink_is_refused(husk, make_bundle) -> None:
    b = make_bundle(["true"])
    os.rmdir(b / "rootfs" / "proc")
    os.symlink("/tmp", b / "rootfs" / "proc")
    cid, cp = husk.create(b, check=False)
    assert cp.returncode == 1 and "proc destination /proc is a symlink" in cp.stderr
    assert not (Path(husk.root) / cid).exists()


def test_symlink_swapped_during_creates_never_escapes(husk, make_bundle, tmp_path: Path) -> None:
    """A running container flips a directory of a shared volume between a real directory and a symlink to a host
    path while other containers are created with a mount below it. Whatever each create sees, nothing may appear
    outside the rootfs and the volume (the host path stays absent)."""
    volume = tmp_path / "volume"
    volume.mkdir()
    marker = _host_marker()
    flipper = f"while :; do rm -rf /v/sub; mkdir /v/sub; rm -rf /v/sub; ln -s {marker} /v/sub; done"

    def add_volume(c):
        c["mounts"].append({"destination": "/v", "type": "bind", "source": str(volume), "options": ["rbind"]})
    cid = unique()
    husk.run(make_bundle(["sh", "-c", flipper], edit=add_volume), cid, "-d")

    def victim(c):
        add_volume(c)
        c["mounts"].append({"destination": "/v/sub/x", "type": "tmpfs", "source": "tmpfs"})
    outcomes = set()
    for _ in range(12):
        b = make_bundle(["true"], edit=victim)
        cp = husk.run(b)
        outcomes.add(cp.returncode)
        assert not marker.exists()
        assert not os.path.lexists(str(marker))
    husk("kill", cid, "KILL")
    assert not marker.exists()
    assert 0 in outcomes  # some creates went through (the others met the flip mid-way and failed cleanly)


def test_masked_and_readonly_paths_hold(husk, make_bundle) -> None:
    from runtime.spec import MASKED, READONLY
    masked = [p for p in MASKED if os.path.exists(p)]
    files = [p for p in masked if os.path.isfile(p)]
    dirs = [p for p in masked if os.path.isdir(p)]
    ro = [p for p in READONLY if os.path.isdir(p)]
    assert files and dirs and ro  # this host has something of each to check
    script = "; ".join([*(f"echo {p} $(cat {p} | wc -c)" for p in files),
                        *(f"echo {p} $(ls -A {p} | wc -l)" for p in dirs),
                        # a namespaced file: writing it would only rename the container, so the attempt is safe
                        "(echo rtit > /proc/sys/kernel/hostname) 2>&1",
                        *(f"(echo x > {p}) 2>&1" for p in files), "cat /proc/self/mountinfo", "echo done"])

    def edit(c):
        # root with the capabilities that would matter if the masks or the read-only remounts were missing
        c["process"]["capabilities"] = {k: ["CAP_DAC_OVERRIDE", "CAP_SYS_RAWIO", "CAP_SYS_ADMIN", "CAP_KILL"]
                                        for k in ("bounding", "effective", "permitted")}
    cp = husk.run(make_bundle(["sh", "-c", script], edit=edit))
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    for p in files + dirs:
        assert f"{p} 0" in lines, (p, cp.stdout)
    assert any(line.endswith("/proc/sys/kernel/hostname: Read-only file system") for line in lines), cp.stdout
    flags = {f[4]: f[5].split(",") for f in (line.split() for line in lines) if len(f) > 6 and f[4].startswith("/")}
    for p in ro:
        assert "ro" in flags[p], (p, flags.get(p))
    assert lines[-1] == "done"


def test_proc_and_sys_are_nosuid_nodev_noexec_even_when_the_config_omits_it(husk, make_bundle) -> None:
    def edit(c):
        for m in c["mounts"]:
            if m["destination"] in ("/proc", "/sys"):
                m["options"] = ["suid", "dev", "exec", "rw"] if m["destination"] == "/proc" else ["ro"]
    cp = husk.run(make_bundle(["cat", "/proc/self/mountinfo"], edit=edit))
    assert cp.returncode == 0, cp.stderr
    seen = {}
    for line in cp.stdout.splitlines():
        fields = line.split()
        seen[fields[4]] = set(fields[5].split(","))
    for dest in ("/proc", "/sys"):
        assert {"nosuid", "nodev", "noexec"} <= seen[dest], (dest, seen[dest])


@pytest.mark.parametrize("mount,needle", [
    ({"destination": "/proc", "type": "tmpfs", "source": "tmpfs"}, "only a proc filesystem"),
    ({"destination": "/proc/sys", "type": "tmpfs", "source": "tmpfs"}, "inside /proc"),
    ({"destination": "/proc/self/attr", "type": "tmpfs", "source": "tmpfs"}, "inside /proc"),
    ({"destination": "/proc/keys", "type": "bind", "source": "/etc/hostname", "options": ["bind"]}, "inside /proc"),
    ({"destination": "/via/kernel", "type": "tmpfs", "source": "tmpfs"}, "resolves to /proc/sys/kernel"),
])
def test_nothing_is_mounted_over_proc(husk, make_bundle, mount: dict, needle: str) -> None:
    """The CVE-2019-19921 class: a mount inside the container's /proc could hide what the kernel says there or
    undo the masked and read-only paths. Only procfs itself and the files lxcfs emulates are allowed."""
    b = make_bundle(["true"], edit=lambda c: c["mounts"].append(mount))
    os.symlink("/proc/sys", b / "rootfs" / "via")  # resolved inside the rootfs: its /proc/sys
    cid, cp = husk.create(b, check=False)
    assert cp.returncode == 1 and needle in cp.stderr, cp.stderr
    assert not (Path(husk.root) / cid).exists()


def test_lxcfs_style_proc_files_may_be_bound(husk, make_bundle, tmp_path: Path) -> None:
    fake = tmp_path / "uptime"
    fake.write_text("12345.67 0.00\n")
    b = make_bundle(["cat", "/proc/uptime"], edit=lambda c: c["mounts"].append(
        {"destination": "/proc/uptime", "type": "bind", "source": str(fake), "options": ["bind", "ro"]}))
    cp = husk.run(b)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == "12345.67 0.00\n"
