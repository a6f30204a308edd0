"""podman (with conmon) driving each runtime binary: runc as the control, husk as the one under test.

Each runtime gets its own podman storage and containers.conf (see dropin_podman for the settings this host
needs); the busybox image is loaded from an OCI archive with `podman load`.
"""
from __future__ import annotations

import logging
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.e2e import dropin_host as host
from tests.e2e.dropin_image import BuiltImage, build_image
from tests.e2e.dropin_podman import PODMAN, PrivatePodman, default_ulimits
from tests.e2e.dropin_runtimes import RUNTIME_NAMES, resolve
from tests.support.waiting import wait_for

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.e2e, pytest.mark.root]


@pytest.fixture(scope="module")
def busybox_image(tmp_path_factory: pytest.TempPathFactory) -> BuiltImage:
    return build_image(tmp_path_factory.mktemp("dropin-image"))


@pytest.fixture(scope="module", params=RUNTIME_NAMES)
def pm(request: pytest.FixtureRequest, busybox_image: BuiltImage):
    if not Path(PODMAN).exists():
        pytest.fail(f"{PODMAN} missing (scripts/install-deps installs podman)")
    runtime = resolve(request.param)
    p = PrivatePodman(runtime)
    try:
        p.setup()
        res = p.podman("load", "-i", str(busybox_image.archive))
        assert busybox_image.name in res.stdout + res.stderr
        yield p
    finally:
        problems = p.stop()
        if problems:
            log.warning("podman teardown (%s): %s", runtime.name, "; ".join(problems))


@pytest.fixture
def name(pm: PrivatePodman):
    if pm.wedged:
        pytest.fail(f"{pm.runtime.name}: not run, an earlier call hung: {pm.wedged}")
    n = f"dropin-{pm.runtime.name}-{uuid.uuid4().hex[:10]}"
    yield n
    try:
        pm.podman("rm", "-f", "-t", "0", n, check=False, timeout=60)
    except subprocess.SubprocessError as e:
        log.warning("cleanup of %s failed: %s", n, e)


def test_loaded_image_is_listed(pm: PrivatePodman, busybox_image: BuiltImage) -> None:
    res = pm.podman("images", "--format", "{{.Repository}}:{{.Tag}}")
    assert busybox_image.name in res.stdout.split()


def test_run_prints_and_exits_zero(pm: PrivatePodman, busybox_image: BuiltImage, name: str) -> None:
    res = pm.run(busybox_image.name, "sh", "-c", f"echo hello from {name}; echo pid=$$", name=name, rm=True)
    assert f"hello from {name}" in res.stdout
    assert "pid=1" in res.stdout


def test_exit_code_reaches_podman(pm: PrivatePodman, busybox_image: BuiltImage, name: str) -> None:
    res = pm.run(busybox_image.name, "sh", "-c", "exit 7", name=name, rm=True, check=False)
    assert res.returncode == 7, res.stderr


def test_missing_binary_is_127(pm: PrivatePodman, busybox_image: BuiltImage, name: str) -> None:
    # podman picks 127 by matching "no such file or directory" in the runtime's stderr (text log format).
    res = pm.run(busybox_image.name, "/no/such/binary", name=name, rm=True, check=False)
    assert res.returncode == 127, res.stderr
    assert "/no/such/binary" in res.stderr


def test_rlimits_from_containers_conf(pm: PrivatePodman, busybox_image: BuiltImage, name: str) -> None:
    res = pm.run(busybox_image.name, "sh", "-c", "ulimit -Sn; ulimit -Hn; ulimit -Su; ulimit -Hu", name=name,
                 rm=True)
    want = []
    for spec in default_ulimits():
        soft, hard = spec.split("=")[1].split(":")
        want.append((spec.split("=")[0], soft, hard))
    nofile = next(w for w in want if w[0] == "nofile")
    nproc = next(w for w in want if w[0] == "nproc")
    assert res.stdout.split() == [nofile[1], nofile[2], nproc[1], nproc[2]]


def test_exec(pm: PrivatePodman, busybox_image: BuiltImage, name: str) -> None:
    pm.run(busybox_image.name, "sleep", "1000", name=name, detach=True)
    res = pm.podman("exec", name, "sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '; echo; echo in-exec; exit 3",
                    check=False)
    assert res.returncode == 3, res.stderr
    assert res.stdout.splitlines()[0].strip() == "sleep 1000"
    assert "in-exec" in res.stdout
    bad = pm.podman("exec", name, "/no/such/binary", check=False)
    assert bad.returncode == 127, bad.stderr
    tty = pm.podman("exec", "-t", name, "tty")
    assert "/dev/pts/" in tty.stdout
    assert pm.inspect(name)["State"]["Status"] == "running"


def test_run_with_tty(pm: PrivatePodman, busybox_image: BuiltImage, name: str) -> None:
    argv = pm.argv("run", "--rm", "-t", "--name", name, *pm.run_flags(), busybox_image.name, "sh", "-c",
                   "tty; exit 5")
    rc, out = host.run_with_pty(argv, env=pm.env, timeout=60, cwd=pm.base)
    assert rc == 5, out
    assert "/dev/pts/0" in out


def test_stop_sends_sigterm(pm: PrivatePodman, busybox_image: BuiltImage, name: str) -> None:
    script = "trap 'exit 42' TERM; while :; do sleep 0.2; done"
    pm.run(busybox_image.name, "sh", "-c", script, name=name, detach=True)
    pm.podman("stop", "-t", "30", name)
    state = pm.inspect(name)["State"]
    assert state["Status"] == "exited"
    assert state["ExitCode"] == 42


def test_stop_escalates_to_sigkill(pm: PrivatePodman, busybox_image: BuiltImage, name: str) -> None:
    # sleep as pid 1 has no TERM handler, so the kernel drops TERM; podman then sends KILL.
    pm.run(busybox_image.name, "sleep", "1000", name=name, detach=True)
    pm.podman("stop", "-t", "1", name)
    state = pm.inspect(name)["State"]
    assert state["Status"] == "exited"
    assert state["ExitCode"] == 137


def test_pause_and_unpause(pm: PrivatePodman, busybox_image: BuiltImage, name: str) -> None:
    pm.run(busybox_image.name, "sleep", "1000", name=name, detach=True)
    cid = pm.inspect(name)["Id"]
    freezer = [p / "freezer.state" for p in host.cgroup_paths(pm.cgroup_path(cid))
               if (p / "freezer.state").exists()]
    pm.podman("pause", name)
    assert pm.inspect(name)["State"]["Status"] == "paused"
    for f in freezer:
        assert f.read_text().strip() == "FROZEN"
    pm.podman("unpause", name)
    assert pm.inspect(name)["State"]["Status"] == "running"
    for f in freezer:
        assert f.read_text().strip() == "THAWED"


def test_memory_and_pids_limits(pm: PrivatePodman, busybox_image: BuiltImage, name: str) -> None:
    pm.run(busybox_image.name, "sleep", "1000", name=name, detach=True,
           extra=("--memory", "64m", "--pids-limit", "20"))
    cid = pm.inspect(name)["Id"]
    paths = host.cgroup_paths(pm.cgroup_path(cid))
    mem = [p for p in paths if (p / "memory.limit_in_bytes").exists()]
    pids = [p for p in paths if (p / "pids.max").exists()]
    assert mem and int((mem[0] / "memory.limit_in_bytes").read_text()) == 64 << 20
    assert pids and (pids[0] / "pids.max").read_text().strip() == "20"
    # The container sees its own limits, and the pids limit stops a fork loop.
    inside = pm.podman("exec", name, "cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                       "/sys/fs/cgroup/pids/pids.max")
    assert inside.stdout.split() == [str(64 << 20), "20"]
    res = pm.podman("exec", name, "sh", "-c", "for i in $(seq 40); do sleep 300 & done; echo all-forked",
                    check=False)
    assert "all-forked" not in res.stdout
    assert "can't fork" in res.stderr
    assert int((pids[0] / "pids.current").read_text()) <= 20


def test_memory_limit_is_enforced(pm: PrivatePodman, busybox_image: BuiltImage, name: str) -> None:
    script = 'x=$(head -c 100000000 /dev/zero | tr "\\0" a); echo survived ${#x}'
    res = pm.run(busybox_image.name, "sh", "-c", script, name=name,
                 extra=("--memory", "32m", "--memory-swap", "32m"), check=False)
    assert res.returncode == 137, (res.stdout, res.stderr)
    assert "survived" not in res.stdout


def test_rm_force_leaves_nothing(pm: PrivatePodman, busybox_image: BuiltImage, name: str) -> None:
    pm.run(busybox_image.name, "sh", "-c", "sleep 1000 & sleep 1000 & wait", name=name, detach=True)
    info = pm.inspect(name)
    cid, pid, conmon = info["Id"], info["State"]["Pid"], info["State"]["ConmonPid"]
    procs = [host.ProcId.of(pid), host.ProcId.of(conmon)]
    assert host.cgroup_paths(pm.cgroup_path(cid))
    pm.podman("rm", "-f", "-t", "0", name)
    wait_for(lambda: pm.leftovers(cid, procs) == [], 20, lambda: f"nothing left of {cid}: {pm.leftovers(cid, procs)}")


def test_stop_then_rm_leaves_nothing(pm: PrivatePodman, busybox_image: BuiltImage, name: str) -> None:
    pm.run(busybox_image.name, "sleep", "1000", name=name, detach=True)
    info = pm.inspect(name)
    cid = info["Id"]
    procs = [host.ProcId.of(info["State"]["Pid"]), host.ProcId.of(info["State"]["ConmonPid"])]
    pm.podman("stop", "-t", "0", name)
    pm.podman("rm", name)
    wait_for(lambda: pm.leftovers(cid, procs) == [], 20, lambda: f"nothing left of {cid}: {pm.leftovers(cid, procs)}")


def test_run_rm_leaves_nothing(pm: PrivatePodman, busybox_image: BuiltImage, name: str) -> None:
    pm.podman("create", "--name", name, *pm.run_flags(), busybox_image.name, "true")
    cid = pm.inspect(name)["Id"]
    pm.podman("start", "--attach", name)
    pm.podman("rm", name)
    wait_for(lambda: pm.leftovers(cid, []) == [], 20, lambda: f"nothing left of {cid}: {pm.leftovers(cid, [])}")


def test_exec_user_env_workdir(pm: PrivatePodman, busybox_image: BuiltImage, name: str) -> None:
    # conmon hands these to the runtime inside `exec --process FILE`
    pm.run(busybox_image.name, "sleep", "1000", name=name, detach=True)
    res = pm.podman("exec", "--user", "1000:1001", "--env", "GREETING=hi there", "--workdir", "/tmp", name,
                    "sh", "-c", 'id -u; id -g; echo "$GREETING"; pwd')
    assert res.stdout.split("\n")[:4] == ["1000", "1001", "hi there", "/tmp"]
    res = pm.podman("exec", "--privileged", name, "sh", "-c", "grep CapEff /proc/self/status")
    assert res.stdout.split()[1] != "0000000000000000"


def test_update_changes_the_running_cgroup(pm: PrivatePodman, busybox_image: BuiltImage, name: str) -> None:
    # podman 4.3 runs `<runtime> update --resources=FILE ID` with a linux.resources JSON
    pm.run(busybox_image.name, "sleep", "1000", name=name, detach=True, extra=("--memory", "64m"))
    cid = pm.inspect(name)["Id"]
    pm.podman("update", "--memory", "96m", "--memory-swap", "192m", "--cpu-shares", "256", name)
    paths = host.cgroup_paths(pm.cgroup_path(cid))
    mem = [p for p in paths if (p / "memory.limit_in_bytes").exists()]
    cpu = [p for p in paths if (p / "cpu.shares").exists()]
    assert int((mem[0] / "memory.limit_in_bytes").read_text()) == 96 << 20
    assert int((mem[0] / "memory.memsw.limit_in_bytes").read_text()) == 192 << 20
    assert int((cpu[0] / "cpu.shares").read_text()) == 256
    inside = pm.podman("exec", name, "cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
    assert inside.stdout.strip() == str(96 << 20)

