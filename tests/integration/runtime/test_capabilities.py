"""Capabilities really dropped: what the config leaves out cannot be used (network admin, mounts), not even by
root inside or through a setuid-root program, and ambient capabilities make a non-root user's program able to
do exactly what they grant. Each case runs with and without the capability, so the check can fail."""
from __future__ import annotations

import os
import shutil

import pytest

pytestmark = pytest.mark.root

BASE = ["CAP_KILL", "CAP_AUDIT_WRITE"]


def _caps(*extra: str, ambient: tuple[str, ...] = ()) -> dict[str, list[str]]:
    names = sorted({*BASE, *extra, *ambient})
    caps = {k: names for k in ("bounding", "effective", "permitted")}
    caps["inheritable"] = sorted(ambient)
    caps["ambient"] = sorted(ambient)
    return caps


def _run(husk, make_bundle, script: str, caps: dict, user: dict | None = None, nnp: bool = True, prepare=None):
    def edit(c):
        c["process"]["capabilities"] = caps
        c["process"]["noNewPrivileges"] = nnp
        c["root"]["readonly"] = False
        if user is not None:
            c["process"]["user"] = user
    b = make_bundle(["sh", "-c", script], edit=edit)
    if prepare is not None:
        prepare(b / "rootfs")
    cp = husk.run(b)
    assert cp.returncode == 0, cp.stderr
    return cp.stdout + cp.stderr


@pytest.mark.parametrize("granted", [False, True])
def test_ip_link_add_needs_cap_net_admin(husk, make_bundle, granted: bool) -> None:
    caps = _caps("CAP_NET_ADMIN") if granted else _caps()
    out = _run(husk, make_bundle, "ip link add rtitbr0 type bridge; echo rc=$?", caps)
    if granted:
        assert "rc=0" in out
    else:
        assert "rc=2" in out and "Operation not permitted" in out


@pytest.mark.parametrize("granted", [False, True])
def test_mount_needs_cap_sys_admin(husk, make_bundle, granted: bool) -> None:
    caps = _caps("CAP_SYS_ADMIN") if granted else _caps()
    out = _run(husk, make_bundle, "mount -t tmpfs none /tmp; echo rc=$?", caps)
    if granted:
        assert "rc=0" in out
    else:
        assert "rc=0" not in out and "permission denied" in out.lower()


def _file_caps_busybox(rootfs) -> None:
    """/opt/busybox with the file capability CAP_NET_ADMIN, effective (what `setcap cap_net_admin+ep` writes):
    a way to ask execve for privileges that busybox does not undo the way it undoes a setuid bit."""
    import struct
    (rootfs / "opt").mkdir(exist_ok=True)
    target = rootfs / "opt" / "busybox"
    shutil.copy2(rootfs / "bin" / "busybox", target)
    permitted = 1 << 12
    # struct vfs_cap_data, revision 2, with the effective flag: magic, then (permitted, inheritable) x 2
    os.setxattr(target, "security.capability", struct.pack("<IIIII", 0x02000000 | 1, permitted, 0, 0, 0))


@pytest.mark.parametrize("nnp,in_bounding", [(False, False), (False, True), (True, True)])
def test_file_capabilities_give_nothing_outside_the_bounding_set(husk, make_bundle, nnp: bool,
                                                                  in_bounding: bool) -> None:
    script = ("/opt/busybox grep -E '^CapEff:' /proc/self/status; "
              "/opt/busybox ip link add rtitbr0 type bridge; echo rc=$?")
    caps = _caps("CAP_NET_ADMIN") if in_bounding else _caps()
    for key in ("effective", "permitted"):
        caps[key] = list(BASE)  # only the bounding set differs between the cases
    out = _run(husk, make_bundle, script, caps, user={"uid": 1000, "gid": 1000}, nnp=nnp, prepare=_file_caps_busybox)
    status = dict(line.split(":\t", 1) for line in out.splitlines() if ":\t" in line)
    if in_bounding and not nnp:
        assert int(status["CapEff"], 16) == 1 << 12  # the file's capability, allowed by the bounding set
        assert "rc=0" in out
    elif nnp:
        assert int(status["CapEff"], 16) == 0  # no_new_privs: the file grants nothing
        assert "rc=2" in out and "Operation not permitted" in out
    else:
        # outside the bounding set the kernel refuses to run a program that cannot get its capabilities at all
        assert "CapEff" not in status and "rc=0" not in out
        assert out.count("Permission denied") + out.count("Operation not permitted") >= 2, out


@pytest.mark.parametrize("ambient", [False, True])
def test_ambient_capabilities_for_a_non_root_user(husk, make_bundle, ambient: bool) -> None:
    amb = ("CAP_CHOWN", "CAP_NET_BIND_SERVICE") if ambient else ()
    script = ("touch /tmp/f; chown 0:0 /tmp/f; echo chown=$?; stat -c %u /tmp/f; "
              "timeout 1 nc -l -p 80; echo bind=$?; grep -E '^Cap(Eff|Amb):' /proc/self/status")
    out = _run(husk, make_bundle, script, _caps(ambient=amb), user={"uid": 1000, "gid": 1000})
    lines = out.splitlines()
    status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    if ambient:
        assert "chown=0" in lines and "0" in lines  # the file now belongs to root
        assert "bind=143" in lines  # bound port 80 and listened until `timeout` ended it
        assert int(status["CapAmb"], 16) == (1 << 0) | (1 << 10)
        assert int(status["CapEff"], 16) == (1 << 0) | (1 << 10)
    else:
        assert "chown=1" in lines and "Operation not permitted" in out
        assert "bind=1" in lines and "Permission denied" in out
        assert int(status["CapEff"], 16) == 0 and int(status["CapAmb"], 16) == 0
