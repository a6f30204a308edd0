"""What a container gets, checked from inside a real busybox container: namespaces, user, rlimits,
capabilities, mounts, devices, cgroup limits, sysctls, the time namespace, scheduling (hooks: test_hooks.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.integration.conftest import run_script

pytestmark = pytest.mark.root


def test_hostname_domainname(husk, make_bundle) -> None:
    def edit(c):
        c["hostname"] = "box1"
        c["domainname"] = "example.test"
    assert run_script(husk, make_bundle, "hostname; cat /proc/sys/kernel/domainname", edit).split() == ["box1", "example.test"]


def test_user_groups_umask_cwd_env(husk, make_bundle) -> None:
    def edit(c):
        c["process"]["user"] = {"uid": 33, "gid": 33, "additionalGids": [1, 65534], "umask": 0o077}
        c["process"]["cwd"] = "/var/www"
        c["process"]["env"].append("GREETING=hi there")
    lines = run_script(husk, make_bundle, "id -u; id -g; id -G; umask; pwd; echo $GREETING; echo $HOME", edit).splitlines()
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
    assert run_script(husk, make_bundle, "ulimit -Sn; ulimit -Hn; ulimit -c", edit).split() == ["321", "654", "0"]


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
    st = _status(run_script(husk, make_bundle, "cat /proc/self/status", edit))
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
    st = _status(run_script(husk, make_bundle, "cat /proc/self/status", edit))
    assert st["CapEff"] == format((1 << 5) | (1 << 10) | (1 << 29), "016x")  # KILL, NET_BIND_SERVICE, AUDIT_WRITE
    assert st["NoNewPrivs"] == "0"


def test_namespaces_are_new(husk, make_bundle) -> None:
    def edit(c):
        c["linux"]["namespaces"].append({"type": "cgroup"})
    text = run_script(husk, make_bundle, "for n in pid net ipc uts mnt cgroup; do readlink /proc/self/ns/$n; done; "
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
    text = run_script(husk, make_bundle, "hostname; readlink /proc/self/ns/net", edit).split()
    assert text[0] == "owner"
    # a hostname may be set in a joined uts namespace (runc allows it; the suite checks it)
    def edit2(c):
        edit(c)
        c["hostname"] = "renamed"
    assert run_script(husk, make_bundle, "hostname", edit2).split() == ["renamed"]
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
    text = run_script(husk, make_bundle, "cat /proc/self/mountinfo; echo ---; touch /x 2>&1; echo rc=$?; "
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
    text = run_script(husk, make_bundle, "ls -l /dev; echo x > /dev/null && echo nullok; head -c 4 /dev/zero | wc -c; "
               "ls /dev/pts")
    for name in ("null", "zero", "full", "random", "urandom", "tty", "shm", "pts", "mqueue"):
        assert f" {name}" in text, name
    assert "fd -> /proc/self/fd" in text and "stdin -> /proc/self/fd/0" in text and "ptmx -> pts/ptmx" in text
    assert "nullok" in text


def test_linux_devices_created_and_allowed(husk, make_bundle) -> None:
    def edit(c):
        c["linux"]["devices"] = [{"path": "/dev/mynull", "type": "c", "major": 1, "minor": 3, "fileMode": 0o646,
                                  "uid": 33, "gid": 33}]
    text = run_script(husk, make_bundle, "stat -c '%F %t %T %a %u %g' /dev/mynull; echo hi > /dev/mynull && echo wrote", edit)
    assert text.splitlines()[0] == "character special file 1 3 646 33 33"
    assert "wrote" in text


def test_device_cgroup_denies_unlisted_device(husk, make_bundle) -> None:
    def edit(c):
        c["linux"]["devices"] = [{"path": "/dev/loopx", "type": "b", "major": 7, "minor": 200}]
        c["linux"]["resources"]["devices"] = [{"allow": False, "access": "rwm"},
                                              {"allow": False, "type": "b", "major": 7, "minor": 200, "access": "rwm"}]
    text = run_script(husk, make_bundle, "cat /sys/fs/cgroup/devices/devices.list; head -c1 /dev/loopx 2>&1; true", edit)
    assert "c 1:3 rwm" in text  # default device allowed


def test_cgroup_limits_seen_inside(husk, make_bundle) -> None:
    def edit(c):
        c["linux"]["resources"].update({
            "memory": {"limit": 64 * 1024 * 1024, "reservation": 32 * 1024 * 1024, "swap": 128 * 1024 * 1024},
            "cpu": {"shares": 512, "quota": 50000, "period": 100000, "cpus": "0"},
            "pids": {"limit": 42},
        })
    text = run_script(husk, make_bundle, "cd /sys/fs/cgroup; cat memory/memory.limit_in_bytes memory/memory.soft_limit_in_bytes "
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
    assert run_script(husk, make_bundle, "cat /proc/sys/net/ipv4/ip_forward /proc/sys/kernel/shmmni", edit).split() == ["1", "1234"]
    with open("/proc/sys/kernel/shmmni") as f:
        assert f.read().strip() != "1234"


def test_oom_score_adj_raise_works_lower_fails_clearly(husk, make_bundle) -> None:
    with open("/proc/self/oom_score_adj") as f:
        cur = int(f.read())
    up = min(cur + 100, 1000)
    assert run_script(husk, make_bundle, "cat /proc/self/oom_score_adj",
               lambda c: c["process"].update(oomScoreAdj=up)).strip() == str(up)
    if cur > -1000:
        cp = husk.run(make_bundle(["true"], edit=lambda c: c["process"].update(oomScoreAdj=-1000)))
        assert cp.returncode == 1
        assert "oomScoreAdj" in cp.stderr and "CAP_SYS_RESOURCE" in cp.stderr


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


@pytest.mark.skipif(not os.path.exists("/proc/self/ns/time"), reason="kernel without time namespaces")
def test_time_namespace_offsets(husk, make_bundle) -> None:
    def edit(c):
        c["linux"]["namespaces"].append({"type": "time"})
        c["linux"]["timeOffsets"] = {"boottime": {"secs": 86400 * 365, "nanosecs": 0},
                                     "monotonic": {"secs": 86400 * 30, "nanosecs": 0}}
    with open("/proc/uptime") as f:
        host_up = float(f.read().split()[0])
    text = run_script(husk, make_bundle, "cat /proc/uptime; readlink /proc/self/ns/time", edit)
    up = float(text.split()[0])
    assert up - host_up > 86400 * 364
    assert text.split()[2] != os.readlink("/proc/self/ns/time")


def test_scheduler_ioprio_affinity_personality(husk, make_bundle) -> None:
    def edit(c):
        c["process"]["scheduler"] = {"policy": "SCHED_BATCH", "nice": 5}
        c["process"]["ioPriority"] = {"class": "IOPRIO_CLASS_IDLE", "priority": 0}
        c["process"]["execCPUAffinity"] = {"final": "0"}
        c["linux"]["personality"] = {"domain": "LINUX32"}
    text = run_script(husk, make_bundle, "grep -E '^Cpus_allowed_list' /proc/self/status; "
                  "awk '{print $19, $41}' /proc/self/stat; uname -m", edit)
    lines = text.splitlines()
    assert lines[0].split()[1] == "0"
    nice, policy = lines[1].split()
    assert nice == "5" and policy == "3"  # SCHED_BATCH
    assert lines[2] in ("i686", "i386")  # PER_LINUX32 makes uname report a 32-bit machine
