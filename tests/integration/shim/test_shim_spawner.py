"""Shims forked from the spawner (zygote) and started fresh with `husk-shim start` (root)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from shim.client import TaskClient
from shim.service import ShimConfig
from shim.spawner import SpawnError, Spawner
from tests.shim_fixtures import TOP, make_bundle, remove_cgroup, unique, wait_for

pytestmark = pytest.mark.root


def _session(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[3])      # ppid, session


def _run_container(address, cid, bundle):
    with TaskClient(address) as c:
        c.Create(id=cid, bundle=bundle)
        c.Start(id=cid)
        assert c.Wait(id=cid, timeout=30).exit_status == 4
        c.Delete(id=cid)
        c.Shutdown(id=cid)


@pytest.fixture
def spawner():
    sp = Spawner()
    sp.start()
    yield sp
    sp.stop()


def test_spawned_shim_runs_container_and_outlives_nothing(tmp_path, spawner):
    cid = unique()
    bundle = make_bundle(str(tmp_path), cid, ["sh", "-c", "exit 4"])
    cfg = ShimConfig(id=cid, address=str(tmp_path / "s.sock"), state_dir=str(tmp_path / "state"),
                     runtime="runc", runtime_root=str(tmp_path / "root"))
    got = None
    try:
        got = spawner.spawn(cfg, log_path=str(tmp_path / "shim.log"))
        assert got.address == f"unix://{tmp_path / 's.sock'}"
        ppid, sid = _session(got.pid)
        assert ppid != os.getpid() and ppid != spawner.pid        # double-forked
        assert sid != os.getsid(0)                                # own session
        with open(f"/proc/{got.pid}/comm") as f:
            assert f.read().strip() == "husk-shim"
        _run_container(got.address, cid, bundle)
        wait_for(lambda: not os.path.exists(f"/proc/{got.pid}") or _zombie(got.pid), 10, "shim exit")
        # a second shim from the same zygote
        cid2 = unique()
        cfg2 = ShimConfig(id=cid2, address=str(tmp_path / "s2.sock"), state_dir=str(tmp_path / "state2"),
                          runtime="runc", runtime_root=str(tmp_path / "root"))
        got2 = spawner.spawn(cfg2, log_path=str(tmp_path / "shim2.log"))
        _run_container(got2.address, cid2, make_bundle(str(tmp_path), cid2, ["sh", "-c", "exit 4"]))
    finally:
        if got is not None and not _zombie(got.pid):
            os.kill(got.pid, signal.SIGKILL)
        subprocess.run(["runc", "--root", str(tmp_path / "root"), "delete", "-f", cid], capture_output=True)
        remove_cgroup(f"/hshim-test/{cid}")


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_spawn_error_is_reported(tmp_path, spawner):
    cfg = ShimConfig(id="x", address="/proc/nope/s.sock", state_dir=str(tmp_path / "st"), runtime="runc")
    with pytest.raises(SpawnError):
        spawner.spawn(cfg)
    # the zygote is still there
    cfg = ShimConfig(id="y", address=str(tmp_path / "y.sock"), state_dir=str(tmp_path / "sty"), runtime="runc")
    got = spawner.spawn(cfg)
    with TaskClient(got.address) as c:
        c.Shutdown(id="y")
    wait_for(lambda: _zombie(got.pid), 10, "shim exit")


def test_husk_shim_start_fresh_interpreter(tmp_path):
    cid = unique()
    bundle = make_bundle(str(tmp_path), cid, ["sh", "-c", "exit 4"])
    state = str(tmp_path / "state")
    r = subprocess.run([sys.executable, "-m", "shim.main", "start", "--id", cid, "--state-dir", state,
                        "--address", str(tmp_path / "f.sock"), "--runtime", "runc",
                        "--runtime-root", str(tmp_path / "root"), "--log", str(tmp_path / "f.log")],
                       capture_output=True, text=True, cwd=TOP, timeout=30)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    pid = info["pid"]
    try:
        with open(f"/proc/{pid}/auxv", "rb") as a, open("/proc/self/auxv", "rb") as b:
            assert a.read() != b.read()         # its own exec (the command line is "husk-shim <id>" now)
        _run_container(info["address"], cid, bundle)
        wait_for(lambda: _zombie(pid), 10, "shim exit")
    finally:
        if not _zombie(pid):
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["runc", "--root", str(tmp_path / "root"), "delete", "-f", cid], capture_output=True)
        remove_cgroup(f"/hshim-test/{cid}")


@pytest.mark.parametrize("runtime,protected", [("husk", True), ("runc", False)])
def test_fresh_shim_of_the_in_process_runtime_starts_protected(tmp_path, runtime, protected):
    """`husk-shim start` with the in-process runtime execs the shim from the protected interpreter
    (runtime/exeguard.py) once, so its creates and execs skip the per-container re-exec; a shim that drives a
    runtime binary has no use for it."""
    from runtime import exeguard
    cid = unique()
    state = str(tmp_path / "state")
    r = subprocess.run([sys.executable, "-m", "shim.main", "start", "--id", cid, "--state-dir", state,
                        "--address", str(tmp_path / "p.sock"), "--runtime", runtime,
                        "--runtime-root", str(tmp_path / "root"), "--log", str(tmp_path / "p.log")],
                       capture_output=True, text=True, cwd=TOP, timeout=30)
    assert r.returncode == 0, r.stderr
    pid = json.loads(r.stdout)["pid"]
    try:
        assert exeguard.is_protected(pid) is protected
        bundle = make_bundle(str(tmp_path), cid, ["sh", "-c", "exit 4"])
        _run_container(json.loads(r.stdout)["address"], cid, bundle)
        wait_for(lambda: _zombie(pid), 10, "shim exit")
    finally:
        if not _zombie(pid):
            os.kill(pid, signal.SIGKILL)
        if runtime == "runc":
            subprocess.run(["runc", "--root", str(tmp_path / "root"), "delete", "-f", cid], capture_output=True)
        else:
            from runtime import lifecycle
            from runtime.errors import ContainerNotFound
            try:
                lifecycle.delete(str(tmp_path / "root"), cid, force=True)
            except ContainerNotFound:
                pass
        remove_cgroup(f"/hshim-test/{cid}")
