"""`husk update` changes a running container's cgroup as runc's update does (same flags, same files)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.cgroups import is_unified
from tests.integration.conftest import unique

pytestmark = pytest.mark.root

# controller, file: the values the update cases below change (cgroup v1 names: this host)
FILES = [("memory", "memory.limit_in_bytes"), ("memory", "memory.memsw.limit_in_bytes"),
         ("memory", "memory.soft_limit_in_bytes"), ("cpu", "cpu.shares"), ("cpu", "cpu.cfs_quota_us"),
         ("cpu", "cpu.cfs_period_us"), ("cpuset", "cpuset.cpus"), ("pids", "pids.max")]

CASES = {
    "memory": ["--memory", "64m", "--memory-swap", "128m", "--memory-reservation", "32m"],
    "memory_unlimited": ["--memory", "-1"],
    "cpu": ["--cpu-quota", "20000", "--cpu-period", "50000", "--cpu-share", "300", "--cpuset-cpus", "0"],
    "quota_alone": ["--cpu-quota", "30000"],
    "pids": ["--pids-limit", "33"],
    "pids_unlimited": ["--pids-limit", "-1"],
}


def read_files(cgroup: str) -> dict[str, str]:
    out = {}
    for ctrl, name in FILES:
        f = Path(f"/sys/fs/cgroup/{ctrl}{cgroup}/{name}")
        out[name] = f.read_text().strip() if f.exists() else "-"
    return out


def edit(c: dict) -> None:
    c["linux"]["resources"].update({"memory": {"limit": 100 << 20, "swap": 200 << 20}, "pids": {"limit": 50},
                                    "cpu": {"shares": 512, "quota": 10000, "period": 100000}})
    c["ociVersion"] = "1.0.2-dev"


@pytest.fixture
def both(husk, runc, make_bundle):
    if is_unified():
        pytest.skip("compares cgroup v1 files (this host's layout); v2 is covered in tests/vm")
    out = {}
    for name, rt in (("husk", husk), ("runc", runc)):
        b = make_bundle(["sleep", "1000"], edit=edit)
        cid = unique(f"rtit-up{name[0]}")
        assert rt.run(b, cid, "-d").returncode == 0
        out[name] = (rt, cid, json.loads((b / "config.json").read_text())["linux"]["cgroupsPath"])
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_update_flags_same_as_runc(case: str, both) -> None:
    got = {}
    for name, (rt, cid, cg) in both.items():
        before = read_files(cg)
        cp = rt("update", *CASES[case], cid, check=False)
        got[name] = (cp.returncode, before, read_files(cg))
    assert got["husk"][1] == got["runc"][1]  # same starting point
    assert got["husk"][0] == got["runc"][0]
    assert got["husk"][2] == got["runc"][2]
    assert got["husk"][2] != got["husk"][1]


@pytest.mark.parametrize("how", ["stdin", "file", "file="])
def test_update_resources_json_same_as_runc(both, tmp_path: Path, how: str) -> None:
    # what containerd's CRI plugin sends (stdin) and podman (--resources=FILE): zeros mean "unchanged"
    res = {"memory": {"limit": 80 << 20, "swap": 160 << 20, "reservation": 0},
           "cpu": {"shares": 1024, "quota": 0, "period": 0, "cpus": "", "mems": ""},
           "pids": {"limit": 0}, "blockIO": {}}
    f = tmp_path / "res.json"
    f.write_text(json.dumps(res))
    got = {}
    for name, (rt, cid, cg) in both.items():
        if how == "stdin":
            cp = rt("update", "--resources", "-", cid, input=json.dumps(res))
        elif how == "file":
            cp = rt("update", "-r", str(f), cid)
        else:
            cp = rt("update", f"--resources={f}", cid)
        assert cp.returncode == 0
        got[name] = read_files(cg)
    assert got["husk"] == got["runc"]
    assert got["husk"]["memory.limit_in_bytes"] == str(80 << 20) and got["husk"]["pids.max"] == "50"


def test_update_is_recorded_for_later_updates(both) -> None:
    rt, cid, cg = both["husk"]
    rt("update", "--cpu-quota", "40000", cid)
    rt("update", "--memory", "90m", "--memory-swap", "190m", cid)
    state = json.loads((Path(rt.root) / cid / "state.json").read_text())
    res = state["config"]["linux"]["resources"]
    assert res["cpu"] == {"shares": 512, "quota": 40000, "period": 100000}
    assert res["memory"] == {"limit": 90 << 20, "swap": 190 << 20}
    assert res["pids"] == {"limit": 50}
    assert read_files(cg)["cpu.cfs_quota_us"] == "40000"


def test_update_errors(both, husk, make_bundle) -> None:
    rt, cid, _ = both["husk"]
    for args, needle in ((["--memory", "lots"], "--memory"), (["--l3-cache-schema", "L3:0=f"], "Intel RDT"),
                         (["--resources", "/no/such/file"], "No such file")):
        cp = rt("update", *args, cid, check=False)
        assert cp.returncode == 1 and needle in cp.stderr, cp.stderr
    cp = rt("update", "-r", "-", cid, input='{"memory": {"limit": "x"}}', check=False)
    assert cp.returncode == 1 and "memory.limit" in cp.stderr
    cp = rt("update", "-r", "-", cid, input="{", check=False)
    assert cp.returncode == 1 and "invalid JSON" in cp.stderr
    cp = rt("update", "--memory", "1m", "nosuchcontainer", check=False)
    assert cp.returncode == 1 and "does not exist" in cp.stderr
    # a stopped container: runc's words
    stopped = unique("rtit-upstop")
    husk.run(make_bundle(["true"]), stopped, "-d")
    husk.wait_status(stopped, "stopped")
    cp = husk("update", "--memory", "64m", stopped, check=False)
    assert cp.returncode == 1 and "container not running" in cp.stderr
