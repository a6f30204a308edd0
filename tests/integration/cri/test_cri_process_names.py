"""Process names under husk-cri: the daemon's comm is "husk-cri", its spawner's "husk-cri-spawne" (command line
"husk-cri-spawner"), every shim's "husk-shim" with the command line "husk-shim <sandbox or container id>", so
that `pgrep -x husk-shim` finds the shims and no daemon, and `pgrep -x husk-cri` the daemon and no shim."""
from __future__ import annotations

import os
import subprocess

import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX
from tests.integration.cri.helpers import container_config, pod_config, run_pod, start_container
from tests.support.procfs import args, comm

pytestmark = [pytest.mark.root, pytest.mark.e2e]


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


def _pgrep(*args: str) -> set[int]:
    r = subprocess.run(["pgrep", *args], capture_output=True, text=True, check=False)
    assert r.returncode in (0, 1), r.stderr
    return {int(x) for x in r.stdout.split()}


def _children(pid: int) -> list[int]:
    out = []
    for p in (int(x) for x in os.listdir("/proc") if x.isdigit()):
        try:
            if _ppid(p) == pid:
                out.append(p)
        except (OSError, ValueError, IndexError):
            continue
    return out


def test_daemon_spawner_and_shims_are_named(cri):
    assert cri.proc is not None
    daemon = cri.proc.pid
    rt = cri.runtime_stub()
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    pod = pod_config(cri, "names")
    pod_id = run_pod(rt, pod)
    start_container(rt, pod_id, pod, container_config("c", ["sleep", "3600"]))

    assert comm(daemon) == "husk-cri"
    spawners = [p for p in _children(daemon) if comm(p) == "husk-cri-spawne"]
    assert len(spawners) == 1, [(p, comm(p)) for p in _children(daemon)]
    spawner = spawners[0]
    assert args(spawner) == "husk-cri-spawner"

    shims = cri.shim_pids()
    # One shim per pod, named after the sandbox: it serves the pod's container too.
    assert [args(p) for p in shims] == [f"husk-shim {pod_id}"]
    assert all(comm(p) == "husk-shim" for p in shims)

    # Other husk-cri instances may run on this machine: check membership, and exactness for ours.
    named_shims = _pgrep("-x", "husk-shim")
    assert set(shims) <= named_shims
    assert not {daemon, spawner} & _pgrep("husk-shim")          # not even as a substring
    assert not named_shims & _pgrep("-x", "husk-cri")
    daemons = _pgrep("-x", "husk-cri")
    assert daemon in daemons and spawner not in daemons
    assert spawner in _pgrep("-f", "^husk-cri-spawner$")
    # pgrep -f finds one pod's shim by its sandbox id
    assert _pgrep("-f", f"^husk-shim {pod_id}$") == set(shims)
