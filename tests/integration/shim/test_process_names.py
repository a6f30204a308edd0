"""Process names of shims started without husk-cri: `husk-shim start` (a fresh interpreter) and a shim forked
from a spawner: comm "husk-shim" (what `pgrep -x husk-shim` matches), command line "husk-shim <id>"."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shim.client import TaskClient
from shim.service import ShimConfig
from shim.spawner import SPAWNER_NAME, Spawner
from tests.shim_fixtures import TOP, unique, wait_for
from tests.support.procfs import args, comm

pytestmark = pytest.mark.root


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _pgrep(*args: str) -> set[int]:
    r = subprocess.run(["pgrep", *args], capture_output=True, text=True, check=False)
    return {int(x) for x in r.stdout.split()}


def _shutdown(address: str, cid: str, pid: int) -> None:
    try:
        with TaskClient(address) as c:
            c.Shutdown(id=cid, now=True)
        wait_for(lambda: _gone(pid), 10, "shim exit")
    finally:
        if not _gone(pid):
            os.kill(pid, 9)


def test_husk_shim_start_names_the_shim(tmp_path):
    cid = unique() + "-" + "f" * 64          # longer than any container id: the whole id shows
    r = subprocess.run([sys.executable, "-m", "shim.main", "start", "--id", cid,
                        "--state-dir", str(tmp_path / "state"), "--address", str(tmp_path / "s.sock"),
                        "--runtime", "runc", "--runtime-root", str(tmp_path / "root"),
                        "--log", str(tmp_path / "s.log")],
                       capture_output=True, text=True, cwd=TOP, timeout=30)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    pid = info["pid"]
    try:
        assert comm(pid) == "husk-shim"
        assert args(pid) == f"husk-shim {cid}"
        assert pid in _pgrep("-x", "husk-shim")
        assert _pgrep("-f", f"^husk-shim {cid}$") == {pid}
    finally:
        _shutdown(info["address"], cid, pid)


def test_spawner_and_spawned_shim_are_named(tmp_path):
    sp = Spawner()
    sp.start()
    try:
        cid = unique()
        # spawn() answers once the zygote has named itself, imported and run its warm-up
        got = sp.spawn(ShimConfig(id=cid, address=str(tmp_path / "y.sock"), state_dir=str(tmp_path / "st"),
                                  runtime="runc", runtime_root=str(tmp_path / "root")))
        try:
            assert comm(sp.pid) == SPAWNER_NAME[:15] == "husk-cri-spawne"
            assert args(sp.pid) == "husk-cri-spawner"
            assert comm(got.pid) == "husk-shim"
            assert args(got.pid) == f"husk-shim {cid}"
            assert sp.pid not in _pgrep("husk-shim") and got.pid in _pgrep("-x", "husk-shim")
        finally:
            _shutdown(got.address, cid, got.pid)
    finally:
        sp.stop()


def test_the_spawners_warm_up_never_names_the_zygote_a_shim():
    """The zygote's dry run serves a shim in the zygote itself: had it taken the shim's name, `pgrep -x husk-shim`
    would list the spawner while husk-cri starts (CI once saw the zygote's comm "husk-shim" right after start)."""
    code = ("import json, sys\n"
            "from runtime.linux import syscalls as sc\n"
            "names = []\n"
            "real = sc.set_name\n"
            "sc.set_name = lambda name: (names.append(name), real(name))[1]\n"
            "from shim import spawner\n"
            "ok = spawner._warm_up()\n"
            "print(json.dumps({'ok': ok, 'names': names}))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=TOP, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ok"], r.stderr              # the dry run ran (else it proves nothing)
    assert out["names"] == [], out["names"]


def test_a_created_containers_init_is_named_as_runcs_stage(husk, make_bundle) -> None:
    """Until `start`, the init waits in the runtime's code: `husk:[2:INIT]` (runc: `runc:[2:INIT]`), never the
    name of whatever forked it (so `pgrep -x husk-shim` lists shims only); after the exec, the user program's."""
    cid, _ = husk.create(make_bundle(["sleep", "1000"]), None)
    try:
        pid = husk.state(cid)["pid"]
        assert comm(pid) == "husk:[2:INIT]"
        husk("start", cid)
        assert comm(pid) == "sleep"
    finally:
        husk("delete", "--force", cid, check=False)
