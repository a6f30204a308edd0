"""runc's flags and outputs whose effect a container or the host can observe, each checked against runc (the
control): kill --all, --no-new-keyring, --no-pivot, the namespaces exec joins, the list and ps tables, and
the annotations in state."""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.integration import leftover
from tests.support.waiting import wait_for

pytestmark = pytest.mark.root

RUNTIMES = ["husk", "runc"]


def cgroup_of(bundle: Path) -> str:
    return json.loads((bundle / "config.json").read_text())["linux"]["cgroupsPath"]


def no_pid_namespace(c: dict[str, Any]) -> None:
    c["linux"]["namespaces"] = [n for n in c["linux"]["namespaces"] if n["type"] != "pid"]


# --- kill --all ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", RUNTIMES)
def test_kill_reaches_the_init_only_and_kill_all_every_process(name, request, make_bundle) -> None:
    # Without its own pid namespace the init's death does not end the others: only --all reaches them.
    rt = request.getfixturevalue(name)
    b = make_bundle(["sh", "-c", "sleep 1000 & sleep 1000 & wait"], edit=no_pid_namespace)
    cg = cgroup_of(b)
    cid = "rtit-killall-" + uuid.uuid4().hex[:8]
    assert rt.run(b, cid, "-d").returncode == 0
    init = rt.state(cid)["pid"]
    wait_for(lambda: len(leftover.processes_of(cg)) == 3, 20, f"3 processes in {cg}")
    others = {p: leftover.start_time(p) for p in leftover.processes_of(cg) if p != init}
    rt("kill", cid, "KILL")
    rt.wait_status(cid, "stopped", 20)
    # the children were never signalled: still alive, still in the container's cgroup
    assert all(leftover.alive(p, t) for p, t in others.items()), others
    assert sorted(leftover.processes_of(cg)) == sorted(others)
    rt("kill", "--all", cid, "KILL")
    wait_for(lambda: leftover.processes_of(cg) == [], 20, f"no process left in {cg}")
    assert not any(leftover.alive(p, t) for p, t in others.items())
    rt("delete", cid)
    assert leftover.leftovers(rt.root, cid, cg, b, others) == []


@pytest.mark.parametrize("name", RUNTIMES)
def test_kill_all_term_ends_the_children_of_an_init_that_ignores_it(name, request, make_bundle) -> None:
    # A pid namespace's init without a handler never sees TERM from outside: the container ends only
    # because --all reached the children, whose end lets the init's `wait` return.
    rt = request.getfixturevalue(name)
    b = make_bundle(["sh", "-c", "sleep 1000 & sleep 1000 & wait"])
    cg = cgroup_of(b)
    cid = "rtit-killterm-" + uuid.uuid4().hex[:8]
    assert rt.run(b, cid, "-d").returncode == 0
    wait_for(lambda: len(leftover.processes_of(cg)) == 3, 20, f"3 processes in {cg}")
    pids = {p: leftover.start_time(p) for p in leftover.processes_of(cg)}
    rt("kill", "--all", cid, "TERM")
    rt.wait_status(cid, "stopped", 20)
    wait_for(lambda: leftover.processes_of(cg) == [], 20, f"no process left in {cg}")
    rt("delete", cid)
    assert leftover.leftovers(rt.root, cid, cg, b, pids) == []


# --- --no-new-keyring ----------------------------------------------------------------------------------
SYS_keyctl = 250
KEYCTL_JOIN_SESSION_KEYRING = 1


def _join_session_keyring(name: str) -> Callable[[], None]:
    """A preexec_fn giving the runtime a session keyring of its own, named `name` (the caller's keyring)."""
    def join() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, name.encode()) < 0:
            raise OSError(ctypes.get_errno(), f"keyctl(JOIN_SESSION_KEYRING, {name})")
    return join


def _keyrings(stdout: str) -> dict[str, int]:
    """/proc/keys lines (serial flags usage timeout perm uid gid type description: summary): keyring -> perm."""
    return {f[8].rstrip(":"): int(f[4], 16) for f in (line.split() for line in stdout.splitlines())
            if len(f) > 8 and f[7] == "keyring"}


def _keyrings_seen(rt, bundle: Path, cid: str, *flags: str, caller_keyring: str) -> dict[str, int]:
    rt.created.append(cid)
    cp = rt("run", *flags, "--bundle", str(bundle), cid, check=False, stdin=subprocess.DEVNULL,
            preexec_fn=_join_session_keyring(caller_keyring))
    assert cp.returncode == 0, cp.stderr
    return _keyrings(cp.stdout)


def _keyrings_seen_by_exec(rt, bundle: Path, cid: str, *flags: str, caller_keyring: str) -> dict[str, int]:
    rt.create(bundle, cid, *flags)
    rt("start", cid)
    cp = rt("exec", "--user", "1234:1234", cid, "cat", "/proc/keys", preexec_fn=_join_session_keyring(caller_keyring))
    rt("delete", "--force", cid)
    return _keyrings(cp.stdout)


@pytest.mark.parametrize("name", RUNTIMES)
def test_new_session_keyring_unless_no_new_keyring(name, request, make_bundle) -> None:
    # A non-root process sees in /proc/keys only the keys it possesses: its session keyring and what that
    # holds. runc names the container's keyring `_ses.<id>` and makes it searchable by its owner, and `exec`
    # joins it; with --no-new-keyring the container keeps the caller's, and exec its own caller's.
    rt = request.getfixturevalue(name)

    def edit(c: dict[str, Any]) -> None:
        c["process"]["user"] = {"uid": 1234, "gid": 1234}
        c["linux"]["maskedPaths"] = [p for p in c["linux"]["maskedPaths"] if p != "/proc/keys"]
    b = make_bundle(["cat", "/proc/keys"], edit=edit)
    caller = "rtit-caller-" + uuid.uuid4().hex[:8]
    cid = "rtit-keys-" + uuid.uuid4().hex[:8]
    seen = _keyrings_seen(rt, b, cid, caller_keyring=caller)
    assert f"_ses.{cid}" in seen and caller not in seen, seen
    assert seen[f"_ses.{cid}"] & 0x00080000, f"{seen[f'_ses.{cid}']:08x}"  # KEY_USR_SEARCH
    cid2 = "rtit-nokeys-" + uuid.uuid4().hex[:8]
    seen = _keyrings_seen(rt, b, cid2, "--no-new-keyring", caller_keyring=caller)
    assert caller in seen and not any(k.startswith("_ses.") for k in seen), seen

    sleeper = make_bundle(["sleep", "1000"], edit=edit)
    exec_caller = "rtit-exec-caller-" + uuid.uuid4().hex[:8]
    cid3 = "rtit-execkeys-" + uuid.uuid4().hex[:8]
    seen = _keyrings_seen_by_exec(rt, sleeper, cid3, caller_keyring=exec_caller)
    assert f"_ses.{cid3}" in seen and exec_caller not in seen, seen
    cid4 = "rtit-execnokeys-" + uuid.uuid4().hex[:8]
    seen = _keyrings_seen_by_exec(rt, sleeper, cid4, "--no-new-keyring", caller_keyring=exec_caller)
    assert exec_caller in seen and not any(k.startswith("_ses.") for k in seen), seen


# --- --no-pivot ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("pivot", [True, False], ids=["pivot_root", "no-pivot"])
@pytest.mark.parametrize("name", RUNTIMES)
def test_nested_user_namespace_cannot_mount_a_bare_proc(name, pivot, request, make_bundle) -> None:
    # runc's tests/integration/no_pivot.bats: without pivot_root the host's mounts stay in the container's
    # mount namespace; a full host procfs among them would let a nested user namespace mount a fresh,
    # unmasked /proc. runc (msMoveRoot) unmounts the host's procfs and sysfs first; with pivot_root the old
    # root is gone anyway. CAP_SETFCAP: mapping uid 0 into the nested namespace needs it.
    rt = request.getfixturevalue(name)

    def edit(c: dict[str, Any]) -> None:
        for s in ("bounding", "permitted", "effective"):
            c["process"]["capabilities"][s].append("CAP_SETFCAP")
    script = "unshare -mrpf sh -c 'echo in-userns; mount -t proc none /proc && echo MOUNTED'; stat -c %i /"
    b = make_bundle(["sh", "-c", script], edit=edit)
    cp = rt.run(b, None, *([] if pivot else ["--no-pivot"]))
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    if "in-userns" not in lines:
        pytest.skip(f"no user namespaces for the container here: {cp.stderr.strip()}")
    assert "MOUNTED" not in lines, cp.stdout
    assert "permission denied" in cp.stderr
    assert lines[-1] == str(os.stat(b / "rootfs").st_ino), lines  # either way "/" is the rootfs itself


# --- exec joins every namespace ------------------------------------------------------------------------
NS_KINDS = ("mnt", "uts", "ipc", "net", "pid", "pid_for_children", "cgroup", "user", "time", "time_for_children")


@pytest.mark.parametrize("userns", [False, True], ids=["no-userns", "userns"])
@pytest.mark.parametrize("name", RUNTIMES)
def test_exec_joins_every_namespace_and_the_cgroup(name, userns, request, make_bundle, tmp_path: Path,
                                                   public_dir: Path) -> None:
    rt = request.getfixturevalue(name)
    time_ns = name == "husk" and os.path.exists("/proc/self/ns/time")  # runc 1.1.5 has no time namespace

    def edit(c: dict[str, Any]) -> None:
        c["linux"]["namespaces"].append({"type": "cgroup"})
        if time_ns:
            c["linux"]["namespaces"].append({"type": "time"})
        if userns:
            c["linux"]["namespaces"].append({"type": "user"})
            c["linux"]["uidMappings"] = [{"containerID": 0, "hostID": 200000, "size": 65536}]
            c["linux"]["gidMappings"] = [{"containerID": 0, "hostID": 200000, "size": 65536}]
            # a user namespace may not mount the host's v1 cgroup hierarchies
            c["mounts"] = [m for m in c["mounts"] if m["destination"] != "/sys/fs/cgroup"]
    b = make_bundle(["sleep", "1000"], edit=edit)
    if userns:
        b = Path(shutil.move(str(b), public_dir / b.name))
    cid = "rtit-execns-" + uuid.uuid4().hex[:8]
    cp = rt.run(b, cid, "-d")
    assert cp.returncode == 0, cp.stderr
    init = rt.state(cid)["pid"]
    pidfile = tmp_path / "exec.pid"
    rt("exec", "--detach", "--pid-file", str(pidfile), cid, "sleep", "1000")
    pid = int(pidfile.read_text())
    kinds = [k for k in NS_KINDS if os.path.exists(f"/proc/self/ns/{k}")]

    def ns(p: int | str) -> dict[str, str]:
        return {k: os.readlink(f"/proc/{p}/ns/{k}") for k in kinds}
    container, exec_, host = ns(init), ns(pid), ns("self")
    assert exec_ == container
    new = {"mnt", "uts", "ipc", "net", "pid", "pid_for_children", "cgroup"} | ({"user"} if userns else set()) \
        | ({"time", "time_for_children"} if time_ns else set())
    assert {k for k in kinds if container[k] != host[k]} == new & set(kinds)
    with open(f"/proc/{init}/cgroup") as f, open(f"/proc/{pid}/cgroup") as g:
        assert g.read() == f.read()
    rt("delete", "--force", cid)


# --- list and ps ---------------------------------------------------------------------------------------
def tabwriter(rows: list[list[str]]) -> str:
    """What Go's text/tabwriter prints for runc's list (minwidth 12, tabwidth 1, padding 3, padchar ' ', no
    flags): each column but the last as wide as max(12, widest cell + 3); the last cell as it is."""
    widths = [max(12, max(len(r[i]) for r in rows) + 3) for i in range(len(rows[0]) - 1)]
    return "".join("".join(c.ljust(w) for c, w in zip(r, widths)) + r[-1] + "\n" for r in rows)


@pytest.mark.parametrize("name", RUNTIMES)
def test_list_table_and_quiet_as_runc(name, request, make_bundle) -> None:
    rt = request.getfixturevalue(name)
    running = "rtit-list-a" + uuid.uuid4().hex[:6]
    created = "rtit-list-b" + uuid.uuid4().hex[:6]
    b1, b2 = make_bundle(["sleep", "1000"]), make_bundle(["sleep", "1000"])
    assert rt.run(b1, running, "-d").returncode == 0
    rt.create(b2, created)
    assert rt("list", "-q").stdout == f"{running}\n{created}\n"
    out = rt("list").stdout
    rows = [line.split() for line in out.splitlines()]
    assert out == tabwriter(rows), out
    want = [["ID", "PID", "STATUS", "BUNDLE", "CREATED", "OWNER"]]
    for cid, bundle in ((running, b1), (created, b2)):
        st = rt.state(cid)
        want.append([cid, str(st["pid"]), st["status"], str(bundle), st["created"], "root"])
    assert rows == want
    listed = json.loads(rt("list", "--format", "json").stdout)
    assert [(c["id"], c["owner"]) for c in listed] == [(running, "root"), (created, "root")]


@pytest.mark.parametrize("name", RUNTIMES)
def test_ps_table_as_runc(name, request, make_bundle) -> None:
    rt = request.getfixturevalue(name)
    cid = "rtit-ps-" + uuid.uuid4().hex[:8]
    assert rt.run(make_bundle(["sh", "-c", "sleep 1000 & sleep 1001 & wait"]), cid, "-d").returncode == 0
    wait_for(lambda: len(set(json.loads(rt("ps", "--format", "json", cid).stdout))) == 3, 20,
             "3 processes in `ps`")
    pids = set(json.loads(rt("ps", "--format", "json", cid).stdout))
    header = subprocess.run(["ps", "-ef"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    for argv in (("ps", cid), ("ps", cid, "-ef")):  # `ps ID [ps options]`: without options, ps -ef
        lines = rt(*argv).stdout.splitlines()
        assert lines[0] == header
        assert {int(line.split()[1]) for line in lines[1:]} == pids
        # CMD: ps cuts it at its default width when stdout is not a terminal
        assert sorted(" ".join(line.split()[7:9]) for line in lines[1:]) == ["sh -c", "sleep 1000", "sleep 1001"]
    lines = rt("ps", cid, "-o", "pid,comm").stdout.splitlines()
    assert lines[0].split() == ["PID", "COMMAND"]
    assert sorted(line.split()[1] for line in lines[1:]) == ["sh", "sleep", "sleep"]
    rt("delete", "--force", cid)


# --- state ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", RUNTIMES)
def test_state_shows_the_configs_annotations(name, request, make_bundle) -> None:
    rt = request.getfixturevalue(name)
    annotations = {"org.example.rtit/a": "1", "rtit.b": "two words", "empty": ""}
    b = make_bundle(["sleep", "1000"], edit=lambda c: c.update(annotations=annotations))
    cid, _ = rt.create(b)
    assert rt.state(cid)["annotations"] == annotations
    rt("start", cid)
    assert rt.state(cid)["annotations"] == annotations
    assert json.loads(rt("list", "--format", "json").stdout)[0]["annotations"] == annotations
    rt("delete", "--force", cid)
