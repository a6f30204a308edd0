"""More of what a container gets: time namespace, rootfs propagation, kill --all, exec options, hook failure
semantics, host limits reported clearly."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.root


def run_ok(husk, make_bundle, script: str, edit=None) -> str:
    cp = husk.run(make_bundle(["sh", "-c", script], edit=edit))
    assert cp.returncode == 0, cp.stderr
    return cp.stdout


@pytest.mark.skipif(not os.path.exists("/proc/self/ns/time"), reason="kernel without time namespaces")
def test_time_namespace_offsets(husk, make_bundle) -> None:
    def edit(c):
        c["linux"]["namespaces"].append({"type": "time"})
        c["linux"]["timeOffsets"] = {"boottime": {"secs": 86400 * 365, "nanosecs": 0},
                                     "monotonic": {"secs": 86400 * 30, "nanosecs": 0}}
    with open("/proc/uptime") as f:
        host_up = float(f.read().split()[0])
    text = run_ok(husk, make_bundle, "cat /proc/uptime; readlink /proc/self/ns/time", edit)
    up = float(text.split()[0])
    assert up - host_up > 86400 * 364
    assert text.split()[2] != os.readlink("/proc/self/ns/time")


@pytest.mark.parametrize("prop,want", [("private", ""), ("slave", "master:"), ("shared", "shared:"),
                                       ("unbindable", "unbindable")])
def test_rootfs_propagation(husk, make_bundle, prop: str, want: str) -> None:
    def edit(c):
        c["linux"]["rootfsPropagation"] = prop
    text = run_ok(husk, make_bundle, "awk '$5 == \"/\" {print}' /proc/self/mountinfo", edit)
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


def test_kill_all_signals_every_process(husk, make_bundle) -> None:
    cid = "rtit-killall-" + os.urandom(3).hex()
    husk.run(make_bundle(["sh", "-c", "sleep 1000 & sleep 1000 & wait"]), cid, "-d")
    for _ in range(200):
        pids = json.loads(husk("ps", "--format", "json", cid).stdout)
        if len(pids) == 3:
            break
        time.sleep(0.02)
    assert len(pids) == 3
    husk("kill", "--all", cid, "KILL")
    for _ in range(500):
        if husk.state(cid)["status"] == "stopped":
            break
        time.sleep(0.02)
    assert husk.state(cid)["status"] == "stopped"
    husk("delete", cid)


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
    for _ in range(500):
        if husk.state(cid)["status"] == "stopped":
            break
        time.sleep(0.02)
    cp = husk("exec", cid, "true", check=False)
    assert cp.returncode == 255 and "stopped" in cp.stderr  # runc: "exec failed: ...", status 255


def test_exec_missing_binary_is_reported(husk, make_bundle) -> None:
    cid = "rtit-execmiss-" + os.urandom(3).hex()
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    cp = husk("exec", cid, "no-such-thing", check=False)
    assert cp.returncode == 255 and "executable file not found" in cp.stderr


def test_failing_poststop_hook_warns_and_continues(husk, make_bundle, tmp_path: Path) -> None:
    mark = tmp_path / "second-ran"
    b = make_bundle(["true"])
    cfg = json.loads((b / "config.json").read_text())
    cfg["hooks"] = {"poststop": [{"path": "/bin/false"}, {"path": "/bin/sh", "args": ["sh", "-c", f"touch {mark}"]}]}
    (b / "config.json").write_text(json.dumps(cfg))
    cid, _ = husk.create(b)
    husk("start", cid)
    for _ in range(500):
        if husk.state(cid)["status"] == "stopped":
            break
        time.sleep(0.02)
    cp = husk("delete", cid)
    assert cp.returncode == 0
    assert mark.exists()
    assert not (Path(husk.root) / cid).exists()


def test_failing_poststart_hook_fails_start_and_stops_container(husk, make_bundle) -> None:
    b = make_bundle(["sleep", "1000"])
    cfg = json.loads((b / "config.json").read_text())
    cfg["hooks"] = {"poststart": [{"path": "/bin/false"}]}
    (b / "config.json").write_text(json.dumps(cfg))
    cid, _ = husk.create(b)
    cp = husk("start", cid, check=False)
    assert cp.returncode == 1 and "poststart hook" in cp.stderr
    for _ in range(500):
        if husk.state(cid)["status"] == "stopped":
            break
        time.sleep(0.02)
    assert husk.state(cid)["status"] == "stopped"


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c["linux"]["resources"].update(hugepageLimits=[{"pageSize": "2MB", "limit": 1 << 21}]), "hugetlb"),
    (lambda c: c["linux"]["resources"].update(blockIO={"leafWeight": 500}), "blkio.leaf_weight"),
    (lambda c: c["linux"]["resources"].update(network={"classID": 5}), "net_cls"),
    (lambda c: c["linux"]["resources"].update(unified={"memory.max": "1000000"}), "cgroup v2"),
    (lambda c: c["process"].update(apparmorProfile="x"), "AppArmor is not enabled"),
])
def test_host_limits_are_clear_errors(husk, make_bundle, edit, needle) -> None:
    if needle == "AppArmor is not enabled" and os.path.isdir("/sys/kernel/security/apparmor"):
        pytest.skip("AppArmor is enabled here")
    b = make_bundle(["true"], edit=edit)
    cg = json.loads((b / "config.json").read_text())["linux"]["cgroupsPath"]
    cid, cp = husk.create(b, check=False)
    assert cp.returncode == 1 and needle in cp.stderr, cp.stderr
    assert not (Path(husk.root) / cid).exists()
    assert not os.path.exists(f"/sys/fs/cgroup/memory{cg}")


def test_blkio_weight_falls_back_to_bfq(husk, make_bundle) -> None:
    # this kernel has no CFQ: blkio.weight is absent, blkio.bfq.weight takes the value (runc does the same)
    text = run_ok(husk, make_bundle, "cat /sys/fs/cgroup/blkio/blkio.bfq.weight 2>/dev/null || "
                  "cat /sys/fs/cgroup/blkio/blkio.weight", lambda c: c["linux"]["resources"].update(
                      blockIO={"weight": 321}))
    assert text.split()[-1] == "321"


def test_launcher_runs_fast_path(tmp_path: Path) -> None:
    import subprocess
    import sys
    out = tmp_path / "husk"
    top = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-m", "runtime.launcher", str(out)], check=True, cwd=top)
    assert out.read_text().startswith(f"#!{sys.executable} -IS\n")
    cp = subprocess.run([str(out), "--root", str(tmp_path / "r"), "state", "nope"], capture_output=True, text=True)
    assert cp.returncode == 1 and "does not exist" in cp.stderr
    cp = subprocess.run([str(out), "--help"], capture_output=True, text=True)
    assert cp.returncode == 0 and "runc" in cp.stdout


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
    text = run_ok(husk, make_bundle, "cat /mnt/share/hello.txt /etc/single.conf; touch /mnt/share/x 2>&1; "
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
    text = run_ok(husk, make_bundle, "grep /mnt/unified /proc/self/mountinfo; ls /mnt/unified | grep -c cgroup.procs",
                  edit)
    assert "cgroup2" in text and text.split()[-1] == "1"


def test_memory_oom_killer_disable_and_swap(husk, make_bundle) -> None:
    def edit(c):
        c["linux"]["resources"]["memory"] = {"limit": 32 << 20, "swap": 64 << 20, "disableOOMKiller": True,
                                             "swappiness": 0}
    text = run_ok(husk, make_bundle, "cd /sys/fs/cgroup/memory; grep oom_kill_disable memory.oom_control; "
                  "cat memory.memsw.limit_in_bytes memory.swappiness", edit)
    assert text.split() == ["oom_kill_disable", "1", str(64 << 20), "0"]


def test_relative_cgroups_path_is_under_our_own_cgroup(husk, make_bundle) -> None:
    from runtime.cgroups import own_cgroup
    rel = "rtit-rel/" + os.urandom(3).hex()
    b = make_bundle(["sh", "-c", "grep pids /proc/self/cgroup"], edit=lambda c: c["linux"].update(cgroupsPath=rel))
    cp = husk.run(b)
    assert cp.returncode == 0, cp.stderr
    expect = os.path.normpath(os.path.join(own_cgroup(), rel))
    assert cp.stdout.strip().endswith(":" + expect)
    for d in Path("/sys/fs/cgroup").glob("*" + os.path.dirname(expect)):
        try:
            d.rmdir()
        except OSError:
            pass


def test_scheduler_ioprio_affinity_personality(husk, make_bundle) -> None:
    def edit(c):
        c["process"]["scheduler"] = {"policy": "SCHED_BATCH", "nice": 5}
        c["process"]["ioPriority"] = {"class": "IOPRIO_CLASS_IDLE", "priority": 0}
        c["process"]["execCPUAffinity"] = {"final": "0"}
        c["linux"]["personality"] = {"domain": "LINUX32"}
    text = run_ok(husk, make_bundle, "grep -E '^Cpus_allowed_list' /proc/self/status; "
                  "awk '{print $19, $41}' /proc/self/stat; uname -m", edit)
    lines = text.splitlines()
    assert lines[0].split()[1] == "0"
    nice, policy = lines[1].split()
    assert nice == "5" and policy == "3"  # SCHED_BATCH
    assert lines[2] in ("i686", "i386")  # PER_LINUX32 makes uname report a 32-bit machine


def test_unsupported_features_are_config_errors(husk, make_bundle) -> None:
    for edit, where in ((lambda c: c["linux"].update(netDevices={"eth1": {}}), "linux.netDevices"),
                        (lambda c: c["process"].update(scheduler={"policy": "SCHED_DEADLINE"}), "process.scheduler")):
        cid, cp = husk.create(make_bundle(["true"], edit=edit), check=False)
        assert cp.returncode == 1 and where in cp.stderr and "not" in cp.stderr


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
        run_ok(husk, make_bundle, "mount -t tmpfs husk-prop-test /vol/sub", edit)
        with open("/proc/self/mountinfo") as f:
            assert any(line.split()[4] == str(vol / "sub") for line in f), "the container's mount did not reach the host"
    finally:
        subprocess.run(["umount", "-R", str(vol)], check=False)
