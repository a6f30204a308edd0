"""User namespaces, checked from the host: the container's root is an unprivileged id outside (its process and
its files carry the mapped ids), it cannot write what host root owns, and `husk spec --rootless` gives a config
that an unprivileged user runs as is (maps written by the parent, setgroups denied, no cgroup of its own)."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.integration.conftest import TOP, unique
from tests.support.waiting import wait_for

pytestmark = pytest.mark.root

HOST_ID = 100000


def _mapped(c: dict, size: int = 65536) -> None:
    c["linux"]["namespaces"].append({"type": "user"})
    c["linux"]["uidMappings"] = [{"containerID": 0, "hostID": HOST_ID, "size": size}]
    c["linux"]["gidMappings"] = [{"containerID": 0, "hostID": HOST_ID, "size": size}]
    # the v1 cgroup tree cannot be mounted from a user namespace that owns no cgroup namespace
    c["mounts"] = [m for m in c["mounts"] if m["destination"] != "/sys/fs/cgroup"]
    c["root"]["readonly"] = False


def _bundle_in(public: Path, bundle: Path, owner: int | None = None) -> Path:
    dest = public / bundle.name
    shutil.move(str(bundle), dest)
    if owner is not None:
        for dirpath, dirnames, filenames in os.walk(dest):
            for name in [*dirnames, *filenames]:
                os.lchown(os.path.join(dirpath, name), owner, owner)
        os.lchown(dest, owner, owner)
    return dest


def test_root_inside_is_the_mapped_id_outside(husk, make_bundle, public_dir: Path) -> None:
    shared = public_dir / "hostowned"
    shared.mkdir()
    (shared / "secret").write_text("host root's\n")
    os.chmod(shared / "secret", 0o644)

    def edit(c):
        _mapped(c)
        c["mounts"].append({"destination": "/hostowned", "type": "bind", "source": str(shared),
                            "options": ["rbind", "rw"]})
        c["process"]["capabilities"] = {k: ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SYS_ADMIN",
                                             "CAP_KILL"] for k in ("bounding", "effective", "permitted")}
    b = _bundle_in(public_dir, make_bundle(["sh", "-c", "touch /made-inside; id -u; stat -c %u /made-inside; "
                                                        "stat -c %u /hostowned/secret; "
                                                        "(echo x >> /hostowned/secret) 2>&1; "
                                                        "(touch /hostowned/new) 2>&1; sleep 1000"],
                                           edit=edit), owner=HOST_ID)
    cid = unique()
    husk.run(b, cid, "-d")
    pid = husk.state(cid)["pid"]
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    assert status["Uid"].split() == [str(HOST_ID)] * 4
    assert status["Gid"].split() == [str(HOST_ID)] * 4
    wait_for(lambda: (b / "rootfs" / "made-inside").exists(), 10, "the detached script's file")
    st = os.stat(b / "rootfs" / "made-inside")
    assert (st.st_uid, st.st_gid) == (HOST_ID, HOST_ID)
    husk("kill", cid, "KILL")
    assert (shared / "secret").read_text() == "host root's\n"
    assert not (shared / "new").exists()


def test_mapped_root_cannot_write_host_root_files(husk, make_bundle, public_dir: Path) -> None:
    shared = public_dir / "hostowned"
    shared.mkdir()
    (shared / "secret").write_text("host root's\n")

    def edit(c):
        _mapped(c)
        c["mounts"].append({"destination": "/hostowned", "type": "bind", "source": str(shared),
                            "options": ["rbind", "rw"]})
        # every capability the host grants: all of them only count inside the user namespace
        caps = [n for n in __import__("runtime.config", fromlist=["x"]).CAPABILITIES if n != "CAP_SYS_RESOURCE"]
        c["process"]["capabilities"] = {k: caps for k in ("bounding", "effective", "permitted")}
    b = _bundle_in(public_dir, make_bundle(["sh", "-c", "id -u; stat -c %u /hostowned/secret; "
                                                        "(echo x >> /hostowned/secret) 2>&1; "
                                                        "(touch /hostowned/new) 2>&1; "
                                                        "(chown 0 /hostowned/secret) 2>&1; "
                                                        "(mknod /dev/sda-rtit b 8 0) 2>&1; echo end"],
                                           edit=edit), owner=HOST_ID)
    cp = husk.run(b)
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    assert lines[0] == "0"            # root inside
    assert lines[1] == "65534"        # host root's file: owned by an id that is not mapped (nobody)
    assert "Permission denied" in lines[2] and "Permission denied" in lines[3]
    assert "Operation not permitted" in lines[4] and "Operation not permitted" in lines[5]
    assert (shared / "secret").read_text() == "host root's\n" and not (shared / "new").exists()


# --- rootless: an unprivileged user runs husk with `husk spec --rootless` ------------------------------------------

LAUNCHER = """#!{python} -IS
import sys
sys.path[0:0] = {paths!r}
from runtime.cli import main
sys.exit(main())
"""


@pytest.fixture
def rootless(public_dir: Path):
    """(argv prefix to run husk as an unprivileged uid, that uid, a directory it owns)."""
    uid = random.randint(23000, 23999)
    site = [p for p in sys.path if p.endswith("site-packages")]
    work = public_dir / "rootless"
    work.mkdir()
    os.chown(work, uid, uid)
    python = None
    for cand in (os.path.realpath(sys.executable), "/usr/bin/python3"):
        probe = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", cand, "-IS", "-c",
                                f"import sys; sys.path[0:0] = {[str(TOP), *site]!r}; import runtime.cli, click"],
                               capture_output=True)
        if probe.returncode == 0:
            python = cand
            break
    if python is None:
        pytest.skip("no Python interpreter with the project importable is reachable by an unprivileged user here")
    launcher = public_dir / "husk-rootless"
    launcher.write_text(LAUNCHER.format(python=python, paths=[str(TOP), *site]))
    os.chmod(launcher, 0o755)
    argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", str(launcher), "--root",
            str(work / "state")]
    made: list[str] = []
    yield argv, uid, work, made
    for cid in made:
        subprocess.run([*argv, "delete", "--force", cid], capture_output=True, timeout=60)


def _as_user(argv: list[str], *args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.run([*argv, *args], stdout=out, stderr=err, stdin=subprocess.DEVNULL, timeout=60)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(p.args, p.returncode, out.read().decode(), err.read().decode())


def _rootless_bundle(make_bundle, argv: list[str], uid: int, work: Path, args: list[str], edit=None) -> Path:
    b = work / f"bundle-{os.urandom(3).hex()}"
    shutil.move(str(make_bundle(["true"])), b)
    (b / "config.json").unlink()
    for dirpath, dirnames, filenames in os.walk(b):
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), uid, uid)
    os.lchown(b, uid, uid)
    cp = _as_user(argv, "spec", "--rootless", "--bundle", str(b))  # written by the unprivileged user itself
    assert cp.returncode == 0, cp.stderr
    cfg = json.loads((b / "config.json").read_text())
    assert cfg["linux"]["uidMappings"] == [{"containerID": 0, "hostID": uid, "size": 1}]
    cfg["process"]["terminal"] = False
    cfg["process"]["args"] = args
    if edit:
        edit(cfg)
    (b / "config.json").write_text(json.dumps(cfg))
    return b


def test_rootless_spec_runs_as_an_unprivileged_user(make_bundle, rootless) -> None:
    argv, uid, work, made = rootless
    b = _rootless_bundle(make_bundle, argv, uid, work,
                         ["sh", "-c", "id -u; cat /proc/self/uid_map /proc/self/gid_map /proc/self/setgroups; "
                                      "touch /tmp/byroot"],
                         edit=lambda c: c["root"].update(readonly=False))
    cid = unique()
    made.append(cid)
    cp = _as_user(argv, "run", "--bundle", str(b), cid)
    assert cp.returncode == 0, cp.stderr
    lines = [line.split() for line in cp.stdout.splitlines()]
    assert lines[0] == ["0"]
    assert lines[1] == ["0", str(uid), "1"] and lines[2] == ["0", str(uid), "1"]
    assert lines[3] == ["deny"]  # the rule for a gid map written without privileges
    st = os.stat(b / "rootfs" / "tmp" / "byroot")
    assert (st.st_uid, st.st_gid) == (uid, uid)
    assert not (work / "state" / cid).exists()  # run deleted it


def test_rootless_container_process_and_exec_seen_from_the_host(make_bundle, rootless) -> None:
    argv, uid, work, made = rootless
    b = _rootless_bundle(make_bundle, argv, uid, work, ["sleep", "1000"])
    cid = unique()
    made.append(cid)
    cp = _as_user(argv, "run", "-d", "--bundle", str(b), cid)
    assert cp.returncode == 0, cp.stderr
    pid = json.loads(_as_user(argv, "state", cid).stdout)["pid"]
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    assert status["Uid"].split() == [str(uid)] * 4
    assert status["CapEff"].strip() != "0000000000000000"  # capabilities, but only inside its user namespace
    with open(f"/proc/{pid}/uid_map") as f:
        assert f.read().split() == ["0", str(uid), "1"]
    cp = _as_user(argv, "exec", cid, "sh", "-c", "id -u; cat /proc/self/setgroups")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split() == ["0", "deny"]
    cp = _as_user(argv, "delete", "--force", cid)
    assert cp.returncode == 0, cp.stderr
    assert not os.path.exists(f"/proc/{pid}") or Path(f"/proc/{pid}/status").read_text().find("Z (zombie)") > 0


def test_rootless_additional_gids_are_a_clear_error(make_bundle, rootless) -> None:
    argv, uid, work, made = rootless
    b = _rootless_bundle(make_bundle, argv, uid, work, ["id"],
                         edit=lambda c: c["process"]["user"].update(additionalGids=[0]))
    cid = unique()
    made.append(cid)
    cp = _as_user(argv, "run", "--bundle", str(b), cid)
    assert cp.returncode != 0
    assert "additionalGids" in cp.stderr and "setgroups is denied" in cp.stderr
    assert not (work / "state" / cid).exists()


def test_rootless_exec_before_start_is_a_clear_error(make_bundle, rootless) -> None:
    """Until it execs, the init is the runtime (non-dumpable): an unprivileged runtime cannot join it yet."""
    argv, uid, work, made = rootless
    b = _rootless_bundle(make_bundle, argv, uid, work, ["sleep", "1000"])
    cid = unique()
    made.append(cid)
    assert _as_user(argv, "create", "--bundle", str(b), cid).returncode == 0
    cp = _as_user(argv, "exec", cid, "true")
    # runc's status for an exec that could not start: 255
    assert cp.returncode == 255 and "before it is started" in cp.stderr and "start it first" in cp.stderr
    assert _as_user(argv, "start", cid).returncode == 0
    cp = _as_user(argv, "exec", cid, "id", "-u")
    assert cp.returncode == 0 and cp.stdout.strip() == "0", cp.stderr
