"""`husk exec`, flag by flag, against runc 1.1.5's behaviour (same container config, same flags)."""
from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import unique

pytestmark = pytest.mark.root


def edit(c: dict) -> None:
    c["process"]["user"] = {"uid": 0, "gid": 0, "additionalGids": [3]}
    c["process"]["env"] = ["PATH=/bin:/sbin", "BASE=1"]
    c["process"]["rlimits"] = [{"type": "RLIMIT_NOFILE", "soft": 321, "hard": 654}]
    c["process"]["capabilities"]["inheritable"] = []
    c["ociVersion"] = "1.0.2-dev"


@pytest.fixture
def both(husk, runc, make_bundle):
    """A running `sleep` container under each runtime, from the same bundle (separate cgroups)."""
    out = {}
    for name, rt in (("husk", husk), ("runc", runc)):
        b = make_bundle(["sleep", "1000"], edit=edit)
        cid = unique(f"rtit-ef{name[0]}")
        cp = rt.run(b, cid, "-d")
        assert cp.returncode == 0, cp.stderr
        out[name] = (rt, cid)
    return out


FLAG_CASES = {
    # (not `ulimit -n`: runc 1.1.5 built with Go 1.19 sometimes leaves an exec'd process the hard limit as its
    # soft limit; husk's rlimits are checked in test_process_file_gets_container_rlimits_and_oom_score)
    "plain": ([], "id; pwd; echo $BASE; ulimit -Hn"),
    "user": (["--user", "1000"], "id"),
    "user_gid": (["--user", "1000:7"], "id"),
    "additional_gids": (["-g", "5", "-g", "6"], "id"),
    "cwd": (["--cwd", "/tmp"], "pwd"),
    "env": (["--env", "X=1", "--env", "BASE=2"], "echo $X $BASE"),
    "cap": (["--cap", "CAP_SYS_ADMIN", "--cap", "CAP_NET_RAW"], "grep ^Cap /proc/self/status"),
    "cap_user": (["--cap", "CAP_NET_ADMIN", "--user", "1000"], "grep ^Cap /proc/self/status"),
    "no_new_privs": (["--no-new-privs"], "grep NoNewPrivs /proc/self/status"),
    "exit_code": ([], "exit 42"),
}


@pytest.mark.parametrize("case", sorted(FLAG_CASES))
def test_exec_flag_same_as_runc(case: str, both) -> None:
    flags, script = FLAG_CASES[case]
    results = {}
    for name, (rt, cid) in both.items():
        results[name] = rt("exec", *flags, cid, "sh", "-c", script, check=False, stdin=subprocess.DEVNULL)
    h, r = results["husk"], results["runc"]
    assert h.returncode == r.returncode, (h.stderr, r.stderr)
    assert h.stdout == r.stdout, (h.stdout, r.stdout)


@pytest.mark.parametrize("flags, args, needle", [
    ([], ["sh", "-c", "true"], None),
    ([], ["/no/such/binary"], "/no/such/binary"),
    (["--process-label", "system_u:system_r:container_t:s0"], ["true"], "SELinux"),
    (["--cwd", "relative"], ["true"], "absolute"),
    (["--user", "x"], ["true"], "uid"),
])
def test_exec_failures_are_255_with_exec_failed(both, flags: list[str], args: list[str], needle: str | None) -> None:
    rt, cid = both["husk"]
    cp = rt("exec", *flags, cid, *args, check=False, stdin=subprocess.DEVNULL)
    if needle is None:
        assert cp.returncode == 0, cp.stderr
        return
    assert cp.returncode == 255, cp.stderr
    assert "exec failed: " in cp.stderr and needle in cp.stderr
    # runc fails the same calls with the same status
    rrt, rcid = both["runc"]
    assert rrt("exec", *flags, rcid, *args, check=False, stdin=subprocess.DEVNULL).returncode == 255


def test_exec_in_paused_container_needs_ignore_paused(both) -> None:
    for name, (rt, cid) in both.items():
        rt("pause", cid)
        try:
            cp = rt("exec", cid, "true", check=False, stdin=subprocess.DEVNULL)
            assert cp.returncode == 255 and "paused" in cp.stderr and "--ignore-paused" in cp.stderr, (name, cp)
        finally:
            rt("resume", cid)


def test_exec_in_created_container(husk, make_bundle) -> None:
    cid, _ = husk.create(make_bundle(["sleep", "1000"]))
    cp = husk("exec", cid, "sh", "-c", "echo $$", stdin=subprocess.DEVNULL)
    assert int(cp.stdout) > 1  # in the container's pid namespace, not its init
    assert husk.state(cid)["status"] == "created"


def test_process_file_gets_container_rlimits_and_oom_score(husk, make_bundle, tmp_path: Path) -> None:
    def ed(c: dict) -> None:
        edit(c)
        c["process"]["oomScoreAdj"] = 500
    cid = unique("rtit-efrl")
    husk.run(make_bundle(["sleep", "1000"], edit=ed), cid, "-d")
    pf = tmp_path / "p.json"
    pf.write_text(json.dumps({"args": ["sh", "-c", "ulimit -n; ulimit -Hn; cat /proc/self/oom_score_adj"],
                              "cwd": "/", "env": ["PATH=/bin"]}))
    cp = husk("exec", "--process", str(pf), cid, stdin=subprocess.DEVNULL)
    assert cp.stdout.split() == ["321", "654", "500"]
    pf.write_text(json.dumps({"args": ["sh", "-c", "ulimit -n"], "cwd": "/", "env": ["PATH=/bin"],
                              "rlimits": [{"type": "RLIMIT_NOFILE", "soft": 100, "hard": 200}]}))
    assert husk("exec", "-p", str(pf), cid, stdin=subprocess.DEVNULL).stdout.strip() == "100"


def test_detach_and_pid_file(husk, make_bundle, tmp_path: Path) -> None:
    cid = unique("rtit-efdet")
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    pidfile = tmp_path / "e.pid"
    cp = husk("exec", "-d", "--pid-file", str(pidfile), cid, "sleep", "999", stdin=subprocess.DEVNULL)
    assert cp.returncode == 0
    pid = int(pidfile.read_text())
    assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"999"]
    assert pid in json.loads(husk("ps", "--format", "json", cid).stdout)


def test_preserve_fds(husk, make_bundle, tmp_path: Path) -> None:
    import shlex
    cid = unique("rtit-effd")
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    data = tmp_path / "data"
    data.write_text("through fd 3\n")
    husk_cmd = " ".join(shlex.quote(a) for a in [*husk.argv, "--root", husk.root])

    def via_shell(flags: str, script: str) -> str:
        # fd 3 is open in the caller, as a program that runs `runc exec --preserve-fds 1` would have it
        line = f"exec 3<{shlex.quote(str(data))}; {husk_cmd} exec {flags} {cid} sh -c {shlex.quote(script)}"
        return subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL).stdout
    assert via_shell("--preserve-fds 1", "cat <&3") == "through fd 3\n"
    assert via_shell("", "cat <&3 2>/dev/null || echo closed").strip() == "closed"


def test_cgroup_sub_paths(husk, make_bundle) -> None:
    from runtime.cgroups import is_unified
    cid = unique("rtit-efcg")
    b = make_bundle(["sleep", "1000"])
    base = json.loads((b / "config.json").read_text())["linux"]["cgroupsPath"]
    husk.run(b, cid, "-d")
    unified = is_unified()
    tops = [Path("/sys/fs/cgroup")] if unified else list(Path("/sys/fs/cgroup").iterdir())
    made = []
    try:
        for top in tops:
            if not (top / base.lstrip("/")).is_dir():
                continue
            for sub in ("all", "mem"):
                d = top / base.lstrip("/") / sub
                d.mkdir()
                made.append(d)
                for name in ("cpuset.cpus", "cpuset.mems"):  # a new v1 cpuset starts empty
                    if not unified and (d / name).exists():
                        (d / name).write_text((d.parent / name).read_text())
        cp = husk("exec", "--cgroup", "all", cid, "cat", "/proc/self/cgroup", stdin=subprocess.DEVNULL)
        lines = dict(line.split(":", 2)[1:] for line in cp.stdout.split())
        if unified:
            assert lines[""] == f"{base}/all"
            cp = husk("exec", "--cgroup", "memory:mem", cid, "true", check=False, stdin=subprocess.DEVNULL)
            assert cp.returncode == 255 and "only on cgroup v1" in cp.stderr
        else:
            assert lines["memory"] == f"{base}/all" and lines["pids"] == f"{base}/all"
            cp = husk("exec", "--cgroup", "memory:mem", "--cgroup", "pids:/mem", cid, "cat", "/proc/self/cgroup",
                      stdin=subprocess.DEVNULL)
            lines = dict(line.split(":", 2)[1:] for line in cp.stdout.split())
            assert lines["memory"] == f"{base}/mem" and lines["pids"] == f"{base}/mem" and lines["freezer"] == base
            cp = husk("exec", "--cgroup", "nosuchctrl:all", cid, "true", check=False, stdin=subprocess.DEVNULL)
            assert cp.returncode == 255 and "unknown controller" in cp.stderr
        cp = husk("exec", "--cgroup", "../escape", cid, "true", check=False, stdin=subprocess.DEVNULL)
        assert cp.returncode == 255 and "not a sub-cgroup" in cp.stderr
        # delete removes the sub-cgroups too (runc does; a systemd inside a container makes them as well)
        husk("delete", "--force", cid)
        assert [d for d in made if d.exists()] == []
    finally:
        husk("delete", "--force", cid)
        for d in reversed(made):
            if d.exists():
                d.rmdir()


def test_tty_in_the_foreground_is_proxied(husk, make_bundle) -> None:
    """`exec -t` without --console-socket: husk allocates the pty inside and copies to its own terminal."""
    cid = unique("rtit-eftty")
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(husk.argv[0], [*husk.argv, "--root", husk.root, "exec", "-t", cid, "sh", "-c",
                                "tty; echo END; exit 6"])
    out = b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 1)
        if not r:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 6, out
    assert b"/dev/pts/" in out and b"END" in out


def test_detached_tty_needs_console_socket(husk, make_bundle) -> None:
    cid = unique("rtit-efdtty")
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    cp = husk("exec", "-t", "-d", cid, "true", check=False, stdin=subprocess.DEVNULL)
    assert cp.returncode == 255 and "console-socket" in cp.stderr


def test_apparmor_is_a_clear_error_without_apparmor(husk, make_bundle) -> None:
    if os.path.isdir("/sys/kernel/security/apparmor"):
        pytest.skip("AppArmor is enabled on this host")
    cid = unique("rtit-efaa")
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    cp = husk("exec", "--apparmor", "some-profile", cid, "true", check=False, stdin=subprocess.DEVNULL)
    assert cp.returncode == 255 and "AppArmor" in cp.stderr


@pytest.mark.parametrize("verb", ["exec", "run"])
def test_socket_activation_needs_listen_pid_to_name_the_runtime(husk, make_bundle, tmp_path: Path, verb: str) -> None:
    """LISTEN_FDS fds go to the process only when LISTEN_PID is the runtime's own pid (systemd's rule, as runc)."""
    import shlex
    cid = unique("rtit-efsa")
    if verb == "exec":
        husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    data = tmp_path / "sock-data"
    data.write_text("activated\n")
    script = 'echo "fds=$LISTEN_FDS pid=$LISTEN_PID"; cat <&3 2>/dev/null || echo no-fd'
    husk_cmd = " ".join(shlex.quote(a) for a in [*husk.argv, "--root", husk.root])
    if verb == "exec":
        call = f"{husk_cmd} exec {cid} sh -c {shlex.quote(script)}"
    else:
        b = make_bundle(["sh", "-c", script])
        husk.created.append(cid)
        call = f"{husk_cmd} run --bundle {shlex.quote(str(b))} {cid}"

    def via_shell(listen_pid: str) -> str:
        line = f"exec 3<{shlex.quote(str(data))}; LISTEN_FDS=1 LISTEN_PID={listen_pid} exec {call}"
        return subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL).stdout
    # `exec` keeps the shell's pid, so $$ is the runtime's pid
    assert via_shell("$$").split("\n")[:2] == ["fds=1 pid=1", "activated"]
    assert via_shell("1").split("\n")[:2] == ["fds= pid=", "no-fd"]


def test_exec_cap_env_cwd(husk, make_bundle) -> None:
    cid = "rtit-execopt-" + os.urandom(3).hex()
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    cp = husk("exec", "--cap", "CAP_NET_ADMIN", "--env", "X=1", "--cwd", "/proc", cid, "sh", "-c",
              "grep CapEff /proc/self/status; echo $X; pwd")
    lines = cp.stdout.split("\n")
    eff = int(lines[0].split()[1], 16)
    assert eff & (1 << 12)  # CAP_NET_ADMIN
    assert lines[1] == "1" and lines[2] == "/proc"
    cp = husk("exec", "--no-new-privs", cid, "grep", "NoNewPrivs", "/proc/self/status")
    assert cp.stdout.split()[1] == "1"


def test_exec_in_stopped_container_fails(husk, make_bundle) -> None:
    cid = "rtit-execstop-" + os.urandom(3).hex()
    husk.run(make_bundle(["true"]), cid, "-d")
    husk.wait_status(cid, "stopped")
    cp = husk("exec", cid, "true", check=False)
    assert cp.returncode == 255 and "stopped" in cp.stderr  # runc: "exec failed: ...", status 255


def test_exec_missing_binary_is_reported(husk, make_bundle) -> None:
    cid = "rtit-execmiss-" + os.urandom(3).hex()
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    cp = husk("exec", cid, "no-such-thing", check=False)
    assert cp.returncode == 255 and "executable file not found" in cp.stderr
