"""What a container gets, checked from inside a real busybox container: namespaces, user, rlimits,
capabilities, mounts, devices, cgroup limits, sysctls, hooks."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.integration import leftover

pytestmark = pytest.mark.root


def out(husk, make_bundle, script: str, edit=None) -> str:
    cp = husk.run(make_bundle(["sh", "-c", script], edit=edit))
    assert cp.returncode == 0, cp.stderr
    return cp.stdout


def test_hostname_domainname(husk, make_bundle) -> None:
    def edit(c):
        c["hostname"] = "box1"
        c["domainname"] = "example.test"
    assert out(husk, make_bundle, "hostname; cat /proc/sys/kernel/domainname", edit).split() == ["box1", "example.test"]


def test_user_groups_umask_cwd_env(husk, make_bundle) -> None:
    def edit(c):
        c["process"]["user"] = {"uid": 33, "gid": 33, "additionalGids": [1, 65534], "umask": 0o077}
        c["process"]["cwd"] = "/var/www"
        c["process"]["env"].append("GREETING=hi there")
    lines = out(husk, make_bundle, "id -u; id -g; id -G; umask; pwd; echo $GREETING; echo $HOME", edit).splitlines()
    assert lines[0] == "33" and lines[1] == "33"
    assert sorted(lines[2].split()) == ["1", "33", "65534"]
    assert lines[3] == "0077"
    assert lines[4] == "/var/www"  # created by the runtime, as runc does
    assert lines[5] == "hi there"
    assert lines[6] == "/var/www"  # HOME from the container's /etc/passwd


def test_rlimits(husk, make_bundle) -> None:
    def edit(c):
        c["process"]["rlimits"] = [{"type": "RLIMIT_NOFILE", "soft": 321, "hard": 654},
                                   {"type": "RLIMIT_CORE", "soft": 0, "hard": 0}]
    assert out(husk, make_bundle, "ulimit -Sn; ulimit -Hn; ulimit -c", edit).split() == ["321", "654", "0"]


def test_rlimit_above_the_hard_limit_fails_create(husk, make_bundle) -> None:
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no finite hard limit to exceed")
    b = make_bundle(["true"], edit=lambda c: c["process"].update(
        rlimits=[{"type": "RLIMIT_NOFILE", "soft": hard + 1, "hard": hard + 1}]))
    cid, cp = husk.create(b, check=False)
    if cp.returncode == 0:
        pytest.skip("this host lets root raise hard limits (CAP_SYS_RESOURCE)")
    assert "RLIMIT_NOFILE" in cp.stderr and "CAP_SYS_RESOURCE" in cp.stderr
    assert not (Path(husk.root) / cid).exists()


def _status(text: str) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def test_capabilities_all_five_sets_and_nnp(husk, make_bundle) -> None:
    def edit(c):
        c["process"]["capabilities"] = {
            "bounding": ["CAP_CHOWN", "CAP_KILL", "CAP_NET_RAW", "CAP_SETUID", "CAP_SETGID"],
            "effective": ["CAP_CHOWN", "CAP_KILL"],
            "permitted": ["CAP_CHOWN", "CAP_KILL", "CAP_NET_RAW"],
            "inheritable": ["CAP_NET_RAW"],
            "ambient": ["CAP_NET_RAW"],
        }
        c["process"]["noNewPrivileges"] = True
        c["process"]["user"] = {"uid": 1000, "gid": 1000}
    st = _status(out(husk, make_bundle, "cat /proc/self/status", edit))
    bit = lambda *ns: format(sum(1 << n for n in ns), "016x")  # noqa: E731
    # the shell was exec'd as uid 1000: after execve only the ambient set survives into permitted/effective
    assert st["CapBnd"] == bit(0, 5, 6, 7, 13)
    assert st["CapInh"] == bit(13)
    assert st["CapAmb"] == bit(13)
    assert st["CapPrm"] == bit(13) and st["CapEff"] == bit(13)
    assert st["NoNewPrivs"] == "1"


def test_root_capabilities_and_no_nnp(husk, make_bundle) -> None:
    def edit(c):
        c["process"]["noNewPrivileges"] = False
    st = _status(out(husk, make_bundle, "cat /proc/self/status", edit))
    assert st["CapEff"] == format((1 << 5) | (1 << 10) | (1 << 29), "016x")  # KILL, NET_BIND_SERVICE, AUDIT_WRITE
    assert st["NoNewPrivs"] == "0"


def test_namespaces_are_new(husk, make_bundle) -> None:
    def edit(c):
        c["linux"]["namespaces"].append({"type": "cgroup"})
    text = out(husk, make_bundle, "for n in pid net ipc uts mnt cgroup; do readlink /proc/self/ns/$n; done; "
               "cat /proc/self/cgroup | grep memory; ip link 2>/dev/null | grep -c LOOPBACK,UP || "
               "cat /sys/class/net/lo/operstate", edit)
    lines = text.splitlines()
    for line in lines[:6]:
        kind = line.split(":")[0]
        assert line != os.readlink(f"/proc/self/ns/{kind}"), kind
    assert lines[6].endswith(":/")  # cgroup namespace: the container's cgroup is its root


def test_join_existing_namespace_by_path(husk, make_bundle) -> None:
    cid = "rtit-nsowner-" + os.urandom(3).hex()
    husk.run(make_bundle(["sleep", "1000"], edit=lambda c: c.update(hostname="owner")), cid, "-d")
    owner = husk.state(cid)["pid"]

    def edit(c):
        c["linux"]["namespaces"] = [n for n in c["linux"]["namespaces"] if n["type"] not in ("uts", "network")]
        c["linux"]["namespaces"] += [{"type": "uts", "path": f"/proc/{owner}/ns/uts"},
                                     {"type": "network", "path": f"/proc/{owner}/ns/net"}]
        c.pop("hostname", None)
    text = out(husk, make_bundle, "hostname; readlink /proc/self/ns/net", edit).split()
    assert text[0] == "owner"
    # a hostname may be set in a joined uts namespace (runc allows it; the suite checks it)
    def edit2(c):
        edit(c)
        c["hostname"] = "renamed"
    assert out(husk, make_bundle, "hostname", edit2).split() == ["renamed"]
    cp = husk("exec", cid, "hostname")
    assert cp.stdout.strip() == "renamed"
    assert text[1] == os.readlink(f"/proc/{owner}/ns/net")


def test_user_namespace_mappings(husk, make_bundle) -> None:
    def edit(c):
        c["linux"]["namespaces"].append({"type": "user"})
        c["linux"]["uidMappings"] = [{"containerID": 0, "hostID": 100000, "size": 65536}]
        c["linux"]["gidMappings"] = [{"containerID": 0, "hostID": 100000, "size": 65536}]
        # sysfs and the cgroup tree cannot be mounted from a user namespace that owns no netns of its own;
        # keep the rest of the default spec
        c["mounts"] = [m for m in c["mounts"] if m["destination"] not in ("/sys/fs/cgroup",)]
    import shutil
    import tempfile
    # the mapped root (host uid 100000) must be able to reach the rootfs: pytest's tmp dirs are 0700
    pub = tempfile.mkdtemp(prefix="rtit-userns-")
    try:
        os.chmod(pub, 0o755)
        b = Path(shutil.move(str(make_bundle(["sh", "-c", "cat /proc/self/uid_map /proc/self/gid_map; id -u"],
                                             edit=edit)), pub))
        cp = husk.run(b)
    finally:
        shutil.rmtree(pub, ignore_errors=True)
    assert cp.returncode == 0, cp.stderr
    text = cp.stdout
    lines = [line.split() for line in text.splitlines()]
    assert lines[0] == ["0", "100000", "65536"] and lines[1] == ["0", "100000", "65536"]
    assert lines[2] == ["0"]


def test_mounts_readonly_root_masked_readonly_paths(husk, make_bundle) -> None:
    def edit(c):
        c["mounts"].append({"destination": "/data", "type": "tmpfs", "source": "tmpfs",
                            "options": ["nosuid", "size=1m", "mode=700"]})
    text = out(husk, make_bundle, "cat /proc/self/mountinfo; echo ---; touch /x 2>&1; echo rc=$?; "
               "cat /proc/keys 2>&1 | wc -c; ls /sys/firmware | wc -l; echo 1 > /proc/sys/kernel/ns_last_pid; "
               "echo rc2=$?; touch /data/ok && echo dataok; stat -c %a /data", edit)
    mountinfo, rest = text.split("---\n", 1)
    mounts = {line.split()[4]: line for line in mountinfo.splitlines()}
    assert " ro," in mounts["/"] or mounts["/"].split()[5].startswith("ro")
    for dest in ("/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", "/sys/fs/cgroup", "/data"):
        assert dest in mounts, dest
    assert mounts["/proc/sys"].split()[5].startswith("ro")
    assert "Read-only file system" in rest and "rc=1" in rest
    lines = rest.splitlines()
    assert lines[2] == "0"  # /proc/keys masked by /dev/null
    assert lines[3] == "0"  # /sys/firmware masked by an empty tmpfs
    assert "rc2=1" in rest
    assert "dataok" in rest and lines[-1] == "700"


def test_dev_default_devices_symlinks_and_pts(husk, make_bundle) -> None:
    text = out(husk, make_bundle, "ls -l /dev; echo x > /dev/null && echo nullok; head -c 4 /dev/zero | wc -c; "
               "ls /dev/pts")
    for name in ("null", "zero", "full", "random", "urandom", "tty", "shm", "pts", "mqueue"):
        assert f" {name}" in text, name
    assert "fd -> /proc/self/fd" in text and "stdin -> /proc/self/fd/0" in text and "ptmx -> pts/ptmx" in text
    assert "nullok" in text


def test_linux_devices_created_and_allowed(husk, make_bundle) -> None:
    def edit(c):
        c["linux"]["devices"] = [{"path": "/dev/mynull", "type": "c", "major": 1, "minor": 3, "fileMode": 0o646,
                                  "uid": 33, "gid": 33}]
    text = out(husk, make_bundle, "stat -c '%F %t %T %a %u %g' /dev/mynull; echo hi > /dev/mynull && echo wrote", edit)
    assert text.splitlines()[0] == "character special file 1 3 646 33 33"
    assert "wrote" in text


def test_device_cgroup_denies_unlisted_device(husk, make_bundle) -> None:
    def edit(c):
        c["linux"]["devices"] = [{"path": "/dev/loopx", "type": "b", "major": 7, "minor": 200}]
        c["linux"]["resources"]["devices"] = [{"allow": False, "access": "rwm"},
                                              {"allow": False, "type": "b", "major": 7, "minor": 200, "access": "rwm"}]
    text = out(husk, make_bundle, "cat /sys/fs/cgroup/devices/devices.list; head -c1 /dev/loopx 2>&1; true", edit)
    assert "c 1:3 rwm" in text  # default device allowed


def test_cgroup_limits_seen_inside(husk, make_bundle) -> None:
    def edit(c):
        c["linux"]["resources"].update({
            "memory": {"limit": 64 * 1024 * 1024, "reservation": 32 * 1024 * 1024, "swap": 128 * 1024 * 1024},
            "cpu": {"shares": 512, "quota": 50000, "period": 100000, "cpus": "0"},
            "pids": {"limit": 42},
        })
    text = out(husk, make_bundle, "cd /sys/fs/cgroup; cat memory/memory.limit_in_bytes memory/memory.soft_limit_in_bytes "
               "memory/memory.memsw.limit_in_bytes cpu/cpu.shares cpu/cpu.cfs_quota_us cpu/cpu.cfs_period_us "
               "cpuset/cpuset.cpus pids/pids.max", edit)
    assert text.split() == [str(64 << 20), str(32 << 20), str(128 << 20), "512", "50000", "100000", "0", "42"]


def test_pids_limit_enforced(husk, make_bundle) -> None:
    def edit(c):
        c["linux"]["resources"]["pids"] = {"limit": 3}
    cp = husk.run(make_bundle(["sh", "-c", "(for i in 1 2 3 4 5; do sleep 2 & done; wait) 2>&1; "
                               "echo max=$(cat /sys/fs/cgroup/pids/pids.max)"], edit=edit))
    assert "max=3" in cp.stdout
    assert "fork" in cp.stdout + cp.stderr  # the shell could not start all five


def test_delete_removes_cgroup(husk, make_bundle) -> None:
    b = make_bundle(["sleep", "1000"])
    cfg = json.loads((b / "config.json").read_text())
    path = cfg["linux"]["cgroupsPath"]
    cid, _ = husk.create(b)
    assert os.path.isdir(f"/sys/fs/cgroup/memory{path}") and os.path.isdir(f"/sys/fs/cgroup/pids{path}")
    husk("delete", "--force", cid)
    assert not os.path.exists(f"/sys/fs/cgroup/memory{path}") and not os.path.exists(f"/sys/fs/cgroup/pids{path}")


def test_sysctl(husk, make_bundle) -> None:
    def edit(c):
        c["linux"]["sysctl"] = {"net.ipv4.ip_forward": "1", "kernel.shmmni": "1234"}
    assert out(husk, make_bundle, "cat /proc/sys/net/ipv4/ip_forward /proc/sys/kernel/shmmni", edit).split() == ["1", "1234"]
    with open("/proc/sys/kernel/shmmni") as f:
        assert f.read().strip() != "1234"


def test_oom_score_adj_raise_works_lower_fails_clearly(husk, make_bundle) -> None:
    with open("/proc/self/oom_score_adj") as f:
        cur = int(f.read())
    up = min(cur + 100, 1000)
    assert out(husk, make_bundle, "cat /proc/self/oom_score_adj",
               lambda c: c["process"].update(oomScoreAdj=up)).strip() == str(up)
    if cur > -1000:
        cp = husk.run(make_bundle(["true"], edit=lambda c: c["process"].update(oomScoreAdj=-1000)))
        assert cp.returncode == 1
        assert "oomScoreAdj" in cp.stderr and "CAP_SYS_RESOURCE" in cp.stderr


def test_hooks_run_in_order_with_state(husk, make_bundle, tmp_path: Path) -> None:
    log = tmp_path / "hooks.log"
    script = tmp_path / "hook.sh"
    script.write_text(f"#!/bin/sh\n{{ echo \"$1 $(cat)\"; }} >> {log}\n")
    script.chmod(0o755)
    b = make_bundle(["true"])
    cfg = json.loads((b / "config.json").read_text())
    # createContainer runs in the container's mount namespace before pivot_root: host paths still resolve
    cfg["hooks"] = {k: [{"path": str(script), "args": ["hook.sh", k]}]
                    for k in ("prestart", "createRuntime", "createContainer", "poststart", "poststop")}
    (b / "config.json").write_text(json.dumps(cfg))
    cid, _ = husk.create(b)
    husk("start", cid)
    import time
    for _ in range(500):
        if husk.state(cid)["status"] == "stopped":
            break
        time.sleep(0.02)
    husk("delete", cid)
    entries = [line.split(" ", 1) for line in log.read_text().splitlines()]
    assert [e[0] for e in entries] == ["prestart", "createRuntime", "createContainer", "poststart", "poststop"]
    states = [json.loads(e[1]) for e in entries]
    assert all(s["id"] == cid and s["bundle"] == str(b) for s in states)
    assert states[3]["status"] == "running" and states[4]["status"] == "stopped"
    assert states[0]["pid"] > 0


def test_failing_prestart_hook_leaves_nothing(husk, make_bundle, tmp_path: Path) -> None:
    b = make_bundle(["true"])
    cfg = json.loads((b / "config.json").read_text())
    cfg["hooks"] = {"prestart": [{"path": "/bin/sh", "args": ["sh", "-c", "echo nope >&2; exit 3"]}]}
    (b / "config.json").write_text(json.dumps(cfg))
    cid, cp = husk.create(b, check=False)
    assert cp.returncode == 1 and "prestart hook" in cp.stderr and "nope" in cp.stderr
    assert not (Path(husk.root) / cid).exists()
    assert not os.path.exists(f"/sys/fs/cgroup/memory{cfg['linux']['cgroupsPath']}")


def _with_hooks(b: Path, hooks: dict) -> str:
    """Sets the bundle's hooks; returns its cgroupsPath."""
    cfg = json.loads((b / "config.json").read_text())
    cfg["hooks"] = hooks
    (b / "config.json").write_text(json.dumps(cfg))
    return cfg["linux"]["cgroupsPath"]


@pytest.mark.parametrize("name", ["husk", "runc"])
def test_failing_create_container_hook_leaves_nothing(name, request, make_bundle) -> None:
    rt = request.getfixturevalue(name)
    b = make_bundle(["true"])
    cg = _with_hooks(b, {"createContainer": [{"path": "/bin/sh", "args": ["sh", "-c", "echo nope >&2; exit 3"]}]})
    cid, cp = rt.create(b, check=False)
    assert cp.returncode == 1 and "nope" in cp.stderr, cp.stderr
    assert leftover.leftovers(rt.root, cid, cg, b) == []
    assert rt("state", cid, check=False).returncode == 1


@pytest.mark.parametrize("name", ["husk", "runc"])
def test_hook_timeout_kills_the_hook_and_leaves_nothing(name, request, make_bundle, tmp_path: Path) -> None:
    rt = request.getfixturevalue(name)
    b = make_bundle(["true"])
    pidfile = tmp_path / "hook.pid"
    script = f"echo $$ $(cut -d' ' -f22 /proc/$$/stat) > {pidfile}; exec sleep 30"
    cg = _with_hooks(b, {"createRuntime": [{"path": "/bin/sh", "args": ["sh", "-c", script], "timeout": 1}]})
    cid, cp = rt.create(b, check=False)
    assert cp.returncode == 1 and ("timed out" in cp.stderr or "timeout" in cp.stderr), cp.stderr
    hook_pid, hook_start = (int(x) for x in pidfile.read_text().split())
    try:
        assert leftover.leftovers(rt.root, cid, cg, b, {hook_pid: hook_start}) == []
    finally:
        if leftover.alive(hook_pid, hook_start):
            os.kill(hook_pid, 9)


@pytest.mark.parametrize("name", ["husk", "runc"])
def test_failing_start_container_hook_fails_start_and_stops_the_container(name, request, make_bundle) -> None:
    # runtime-spec: a failing startContainer hook is an error, the container is stopped, and the lifecycle
    # continues with delete. runc 1.1.5 stops the container too but `start` still returns 0 (it only opens
    # the exec fifo; the hook fails in its init afterwards); husk reports the error, as the spec says.
    rt = request.getfixturevalue(name)
    b = make_bundle(["sleep", "1000"])
    cg = _with_hooks(b, {"startContainer": [{"path": "/bin/false"}]})
    cid, _ = rt.create(b)
    pid = rt.state(cid)["pid"]
    pids = {pid: leftover.start_time(pid)}
    cp = rt("start", cid, check=False)
    if name == "husk":
        assert cp.returncode == 1 and "startContainer hook" in cp.stderr, cp.stderr
    else:
        assert cp.returncode == 0, cp.stderr
    for _ in range(500):
        if rt.state(cid)["status"] == "stopped":
            break
        time.sleep(0.02)
    assert rt.state(cid)["status"] == "stopped"
    assert leftover.processes_of(cg) == [] and not leftover.alive(pid, pids[pid])
    rt("delete", cid)
    assert leftover.leftovers(rt.root, cid, cg, b, pids) == []


def test_missing_executable_is_a_create_error(husk, make_bundle) -> None:
    cid, cp = husk.create(make_bundle(["no-such-binary"]), check=False)
    assert cp.returncode == 1 and "executable file not found" in cp.stderr
    assert not (Path(husk.root) / cid).exists()


def test_no_pivot(husk, make_bundle) -> None:
    cp = husk.run(make_bundle(["sh", "-c", "ls /bin/busybox && cat /proc/self/mountinfo | wc -l"]), None, "--no-pivot")
    assert cp.returncode == 0, cp.stderr
    assert "/bin/busybox" in cp.stdout


def test_preserve_fds(husk, make_bundle, tmp_path: Path) -> None:
    extra = tmp_path / "extra.txt"
    extra.write_text("through fd 3\n")
    fd = os.open(extra, os.O_RDONLY)
    try:
        os.set_inheritable(fd, True)
        assert fd == 3 or os.dup2(fd, 3) == 3
        import subprocess
        b = make_bundle(["sh", "-c", "cat <&3; ls /proc/self/fd"])
        p = subprocess.run([*husk.argv, "--root", husk.root, "run", "--preserve-fds", "1", "--bundle", str(b),
                            "rtit-pfd-" + os.urandom(3).hex()], capture_output=True, text=True, pass_fds=(3,),
                           stdin=subprocess.DEVNULL, timeout=60)
    finally:
        os.close(fd)
    assert p.returncode == 0, p.stderr
    assert "through fd 3" in p.stdout
    assert p.stdout.split("\n", 1)[1].split() in (["0", "1", "2", "3"], ["0", "1", "2", "3", "4"])
