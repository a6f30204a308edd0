"""husk-shim drives every runc-compatible binary on cgroup v2: crun (which refuses the development host's hybrid
cgroups, so it runs here only), runc and husk's own launcher as a binary. One container per runtime goes through
create, start, exec (output and status), kill of an exec, pause/resume, stats, kill, wait and delete, and
leaves no state, cgroup or process behind. Grouped into one test per runtime: Python starts slowly under
emulation (the shim, and every call of the husk binary)."""
from __future__ import annotations

import json
import os
import signal

import pytest

from shim.pb import cgroups_v1, google, task_types
from tests.shim_fixtures import (binary_runtimes, cgroup_v2_unified, cleanup_shim, make_bundle, runtime_id,
                                 start_shim, wait_for)

pytestmark = [pytest.mark.vm, pytest.mark.root]
S = task_types.Status


def _spec(args: list[str]) -> google.Any:
    return google.Any(type_url="types.containerd.io/opencontainers/runtime-spec/1/Process",
                      value=json.dumps({"args": args, "cwd": "/", "env": ["PATH=/bin"],
                                        "user": {"uid": 0, "gid": 0}}).encode())


def _cgroup_dir(cid: str) -> str:
    return f"/sys/fs/cgroup/hshim-test/{cid}"   # make_bundle's cgroupsPath on the unified hierarchy


@pytest.mark.parametrize("runtime", binary_runtimes(), ids=runtime_id)
def test_shim_drives_the_runtime_binary(tmp_path, runtime) -> None:
    assert cgroup_v2_unified()  # tests/vm/conftest.py runs vm tests only there
    s = start_shim(str(tmp_path), runtime)
    try:
        bundle = make_bundle(str(tmp_path), s.cid, ["sleep", "1000"])
        out = tmp_path / "exec.out"
        with s.client() as c:
            pid = c.Create(id=s.cid, bundle=bundle).pid
            assert c.State(id=s.cid).status == S.CREATED
            # the runtime put the init into its own cgroup on the unified hierarchy
            with open(f"{_cgroup_dir(s.cid)}/cgroup.procs") as f:
                assert str(pid) in f.read().split()
            assert c.Start(id=s.cid).pid == pid
            assert c.State(id=s.cid).status == S.RUNNING

            c.Exec(id=s.cid, exec_id="e1", stdout=f"file://{out}", stderr=f"file://{out}",
                   spec=_spec(["sh", "-c", "cat /proc/self/cgroup; echo from-exec; exit 3"]))
            c.Start(id=s.cid, exec_id="e1")
            assert c.Wait(id=s.cid, exec_id="e1", timeout=120).exit_status == 3
            text = out.read_text()
            assert "from-exec" in text and text.startswith("0::"), text   # v2 only: one "0::" line
            c.Delete(id=s.cid, exec_id="e1")

            c.Exec(id=s.cid, exec_id="e2", spec=_spec(["sleep", "1000"]))
            epid = c.Start(id=s.cid, exec_id="e2").pid
            assert {pid, epid} <= {p.pid for p in c.Pids(id=s.cid).processes}
            c.Kill(id=s.cid, exec_id="e2", signal=signal.SIGKILL)
            assert c.Wait(id=s.cid, exec_id="e2", timeout=120).exit_status == 137
            c.Delete(id=s.cid, exec_id="e2")

            c.Pause(id=s.cid)
            assert c.State(id=s.cid).status == S.PAUSED
            with open(f"{_cgroup_dir(s.cid)}/cgroup.freeze") as f:
                assert f.read().strip() == "1"
            c.Resume(id=s.cid)
            assert c.State(id=s.cid).status == S.RUNNING
            m = cgroups_v1.Metrics.decode(c.Stats(id=s.cid).stats.value)
            assert m.pids.current >= 1 and m.memory.usage.usage > 0

            c.Kill(id=s.cid, signal=signal.SIGKILL)
            assert c.Wait(id=s.cid, timeout=120).exit_status == 137
            d = c.Delete(id=s.cid)
            assert (d.pid, d.exit_status) == (pid, 137)
            c.Shutdown(id=s.cid)
        s.proc.wait(60)
        assert s.proc.returncode == 0
        assert not os.path.exists(f"/proc/{pid}")
        assert not os.path.exists(_cgroup_dir(s.cid))
        # the runtime has forgotten it: no state dir under its --root
        assert s.cid not in (os.listdir(s.runtime_root) if os.path.isdir(s.runtime_root) else [])
        wait_for(lambda: not os.path.exists(s.address), 30, "the shim's socket to go")
    finally:
        cleanup_shim(s)
