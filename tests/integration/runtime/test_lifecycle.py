"""The lifecycle verbs from the command line: state transitions as the OCI runtime spec gives them."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.integration import leftover
from tests.support.waiting import wait_for

pytestmark = pytest.mark.root


def test_create_start_kill_delete(husk, make_bundle, tmp_path: Path) -> None:
    b = make_bundle(["sleep", "1000"])
    pidfile = tmp_path / "pid"
    cid, _ = husk.create(b, None, "--pid-file", str(pidfile))
    st = husk.state(cid)
    assert st["status"] == "created"
    assert st["id"] == cid and st["bundle"] == str(b) and st["ociVersion"].startswith("1.")
    assert int(pidfile.read_text()) == st["pid"]
    # the init waits on the exec fifo: the user program has not run yet
    with open(f"/proc/{st['pid']}/cmdline", "rb") as f:
        assert b"sleep" not in f.read()
    husk("start", cid)
    st = husk.state(cid)
    assert st["status"] == "running"
    with open(f"/proc/{st['pid']}/cmdline", "rb") as f:
        assert f.read().split(b"\0")[0] == b"sleep"
    cp = husk("start", cid, check=False)
    assert cp.returncode == 1 and "only a created container can be started" in cp.stderr
    cp = husk("delete", cid, check=False)
    assert cp.returncode == 1 and "running" in cp.stderr
    husk("kill", cid, "KILL")
    husk.wait_status(cid, "stopped")
    cp = husk("kill", cid, "TERM", check=False)
    # runc's words: containerd's shim turns exactly "container not running" into "process already finished"
    assert cp.returncode == 1 and "container not running" in cp.stderr
    assert husk("kill", "--all", cid, "KILL").returncode == 0  # containerd sends this to stopped containers too
    husk("delete", cid)
    assert not (Path(husk.root) / cid).exists()
    cp = husk("state", cid, check=False)
    assert cp.returncode == 1 and "does not exist" in cp.stderr


@pytest.mark.parametrize("runtime", ["husk", "runc"])
def test_delete_of_created_container_kills_it_as_runc_does(runtime, request, make_bundle) -> None:
    # runc (and so husk) deletes a created container without --force: it kills the waiting init first.
    # containerd's runc shim relies on it: deleting a task that was created but never started runs
    # `runc delete ID` (createdState.Delete). runc is the control here.
    rt = request.getfixturevalue(runtime)
    b = make_bundle(["sleep", "1000"])
    cg = json.loads((b / "config.json").read_text())["linux"]["cgroupsPath"]
    cid, _ = rt.create(b)
    pid = rt.state(cid)["pid"]
    pids = {pid: leftover.start_time(pid)}
    assert leftover.cgroup_dirs(cg) and leftover.processes_of(cg) == [pid]
    cp = rt("delete", cid, check=False)
    assert cp.returncode == 0, cp.stderr
    assert leftover.leftovers(rt.root, cid, cg, b, pids) == []
    assert rt("state", cid, check=False).returncode == 1


@pytest.mark.parametrize("runtime", ["husk", "runc"])
def test_delete_of_running_container_needs_force(runtime, request, make_bundle) -> None:
    rt = request.getfixturevalue(runtime)
    b = make_bundle(["sleep", "1000"])
    cg = json.loads((b / "config.json").read_text())["linux"]["cgroupsPath"]
    cid, _ = rt.create(b)
    rt("start", cid)
    pid = rt.state(cid)["pid"]
    cp = rt("delete", cid, check=False)
    assert cp.returncode == 1 and "running" in cp.stderr
    assert rt.state(cid)["status"] == "running" and leftover.alive(pid, leftover.start_time(pid))
    pids = {pid: leftover.start_time(pid)}
    rt("delete", "--force", cid)
    assert leftover.leftovers(rt.root, cid, cg, b, pids) == []


def test_kill_created_container_stops_it(husk, make_bundle) -> None:
    cid, _ = husk.create(make_bundle(["true"]))
    husk("kill", cid, "9")
    husk.wait_status(cid, "stopped")
    husk("delete", cid)


def test_sigterm_stops_a_created_container(husk, make_bundle) -> None:
    cid, _ = husk.create(make_bundle(["true"]))
    husk("kill", cid, "TERM")
    husk.wait_status(cid, "stopped")
    husk("delete", cid)


def test_run_returns_exit_code(husk, make_bundle) -> None:
    cp = husk.run(make_bundle(["sh", "-c", "echo out; echo err >&2; exit 7"]))
    assert cp.returncode == 7
    assert cp.stdout == "out\n" and cp.stderr == "err\n"


def test_run_killed_by_signal_is_128_plus_signal(husk, make_bundle) -> None:
    cid = "rtit-sig-" + os.urandom(3).hex()
    husk.created.append(cid)
    p = subprocess.Popen([*husk.argv, "--root", husk.root, "run", "--bundle", str(make_bundle(["sleep", "1000"])),
                          cid], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (cp := husk("state", cid, check=False)).returncode == 0 and '"running"' in cp.stdout, 10,
                 f"{cid} to be running")
        husk("kill", cid, "SIGKILL")
        assert p.wait(timeout=30) == 128 + signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_run_forwards_signals(husk, make_bundle) -> None:
    # sh as pid 1 ignores signals it has no handler for: trap one and exit with a code that proves it arrived
    b = make_bundle(["sh", "-c", "trap 'exit 42' TERM; echo ready; while :; do sleep 0.05; done"])
    cid = "rtit-fwd-" + os.urandom(3).hex()
    husk.created.append(cid)
    p = subprocess.Popen([*husk.argv, "--root", husk.root, "run", "--bundle", str(b), cid],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"ready\n"
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 42
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_run_deletes_container_afterwards(husk, make_bundle) -> None:
    cid = "rtit-run-cleanup-" + os.urandom(3).hex()
    cp = husk.run(make_bundle(["true"]), cid)
    assert cp.returncode == 0
    assert husk("list", "-q").stdout.split() == []


def test_run_detached_then_state_and_list(husk, make_bundle) -> None:
    cid = "rtit-detach-" + os.urandom(3).hex()
    cp = husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    assert cp.returncode == 0, cp.stderr
    assert husk.state(cid)["status"] == "running"
    import json
    listed = json.loads(husk("list", "--format", "json").stdout)
    assert [c["id"] for c in listed] == [cid] and listed[0]["status"] == "running"
    husk("delete", "--force", cid)


def test_exec_joins_namespaces_and_returns_code(husk, make_bundle) -> None:
    cid = "rtit-exec-" + os.urandom(3).hex()
    husk.run(make_bundle(["sleep", "1000"], edit=lambda c: c.update(hostname="exechost")), cid, "-d")
    cp = husk("exec", cid, "sh", "-c", "hostname; echo $$; exit 3", check=False)
    assert cp.returncode == 3, cp.stderr
    host, pid = cp.stdout.split()
    assert host == "exechost"
    assert int(pid) > 1  # inside the container's pid namespace: small pids
    init_pid = husk.state(cid)["pid"]
    assert os.readlink(f"/proc/{init_pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    cp = husk("exec", "--user", "65534:65534", cid, "id", "-u")
    assert cp.stdout.strip() == "65534"


def test_exec_process_file_and_detach(husk, make_bundle, tmp_path: Path) -> None:
    import json
    cid = "rtit-execp-" + os.urandom(3).hex()
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    proc = {"args": ["sh", "-c", "echo $FOO > /dev/shm/out; sleep 1000"], "cwd": "/tmp", "env": ["FOO=bar"],
            "user": {"uid": 0, "gid": 0}}
    pf = tmp_path / "process.json"
    pf.write_text(json.dumps(proc))
    pidfile = tmp_path / "exec.pid"
    husk("exec", "--process", str(pf), "--detach", "--pid-file", str(pidfile), cid)
    pid = int(pidfile.read_text())
    assert os.path.exists(f"/proc/{pid}")
    cp = wait_for(lambda: (r := husk("exec", cid, "cat", "/dev/shm/out", check=False)).returncode == 0
                  and r.stdout.strip() and r, 10, "the detached exec's output file")
    assert cp.stdout.strip() == "bar"
    assert pid in [int(x) for x in __import__("json").loads(husk("ps", "--format", "json", cid).stdout)]


def test_pause_resume(husk, make_bundle) -> None:
    cid = "rtit-pause-" + os.urandom(3).hex()
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    husk("pause", cid)
    st = husk.state(cid)
    assert st["status"] == "paused"
    cp = husk("start", cid, check=False)
    assert cp.returncode == 1
    husk("resume", cid)
    assert husk.state(cid)["status"] == "running"
    cp = husk("resume", cid, check=False)
    assert cp.returncode == 1 and "not paused" in cp.stderr


def _blocked_on_flock(pid: int) -> bool:
    with open("/proc/locks") as f:
        return any(line.split()[1:3] == ["->", "FLOCK"] and line.split()[5] == str(pid) for line in f)


def test_state_dir_is_locked_against_concurrent_delete(husk, make_bundle) -> None:
    import fcntl
    cid, _ = husk.create(make_bundle(["true"]))
    fd = os.open(os.path.join(husk.root, cid), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        p = subprocess.Popen([*husk.argv, "--root", husk.root, "delete", "--force", cid],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # /proc/locks lists a blocked request as "N: -> FLOCK ADVISORY WRITE <pid> ...": delete is waiting for our lock
        wait_for(lambda: p.poll() is not None or _blocked_on_flock(p.pid), 30, "delete to block on the state lock")
        assert p.poll() is None, p.communicate()
        assert (Path(husk.root) / cid).exists()
    finally:
        os.close(fd)
    assert p.wait(timeout=30) == 0
    assert not (Path(husk.root) / cid).exists()


def test_console_socket_receives_pty_master(husk, make_bundle, tmp_path: Path) -> None:
    import socket
    path = str(tmp_path / "console.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    b = make_bundle(["sh", "-c", "tty; echo done"], terminal=True)
    cid, _ = husk.create(b, None, "--console-socket", path)
    conn, _ = srv.accept()
    _msg, fds, _, _ = socket.recv_fds(conn, 1024, 1)
    master = fds[0]
    husk("start", cid)
    out = b""
    while b"done" not in out:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    conn.close()
    srv.close()
    assert b"/dev/pts/0" in out and b"done" in out


def test_force_delete_of_paused_container(husk, make_bundle) -> None:
    cid = "rtit-pausedel-" + os.urandom(3).hex()
    b = make_bundle(["sh", "-c", "sleep 1000 & sleep 1000"])
    husk.run(b, cid, "-d")
    import json
    path = json.loads((b / "config.json").read_text())["linux"]["cgroupsPath"]
    husk("pause", cid)
    assert husk.state(cid)["status"] == "paused"
    husk("delete", "--force", cid)
    assert not (Path(husk.root) / cid).exists()
    assert not os.path.exists(f"/sys/fs/cgroup/freezer{path}")


def test_exec_tty_over_console_socket(husk, make_bundle, tmp_path: Path) -> None:
    import socket
    import threading
    cid = "rtit-exectty-" + os.urandom(3).hex()
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    path = str(tmp_path / "exec-console.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    got: dict = {}

    def receive() -> None:
        conn, _ = srv.accept()
        _msg, fds, _, _ = socket.recv_fds(conn, 1024, 1)
        conn.close()
        master = fds[0]
        out = b""
        while True:  # until the process exits (EIO): closing the master early would SIGHUP it
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        os.close(master)
        got["out"] = out

    t = threading.Thread(target=receive)
    t.start()
    cp = husk("exec", "--tty", "--console-socket", path, cid, "sh", "-c", "tty; echo END", check=False)
    t.join(timeout=30)
    srv.close()
    assert cp.returncode == 0, cp.stderr
    assert b"/dev/pts/" in got.get("out", b"") and b"END" in got["out"]


def test_exec_into_missing_sub_cgroup_fails(husk, make_bundle) -> None:
    cid = "rtit-execcg-" + os.urandom(3).hex()
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    cp = husk("exec", "--cgroup", "no-such-sub", cid, "true", check=False)
    assert cp.returncode == 255 and "does not exist" in cp.stderr


def test_kill_all_signals_every_process(husk, make_bundle) -> None:
    cid = "rtit-killall-" + os.urandom(3).hex()
    husk.run(make_bundle(["sh", "-c", "sleep 1000 & sleep 1000 & wait"]), cid, "-d")
    wait_for(lambda: len(json.loads(husk("ps", "--format", "json", cid).stdout)) == 3, 10,
             "the container's shell and its two sleeps")
    husk("kill", "--all", cid, "KILL")
    husk.wait_status(cid, "stopped")
    husk("delete", cid)
