"""husk-cri's shims really come from its spawner (the zygote forked before gRPC), not from the fallback that
starts `python -m shim.main start` processes when the spawner is missing or gone: a forked shim shares the
zygote's exec (same auxiliary vector: fork, no exec), a fresh one has its own; the zygote is husk-cri's child, a
fresh interpreter (not a fork of husk-cri's heap); the log has no fallback warning."""
from __future__ import annotations

import os

import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX
from tests.integration.cri.helpers import container_config, nothing_left, pod_config, run_pod, start_container
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.e2e]

FALLBACK_MESSAGES = ("no shim spawner", "the shim spawner is gone")


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]


def _auxv(pid: int) -> bytes:
    """The auxiliary vector the kernel gave the process at exec (AT_RANDOM, AT_EXECFN... addresses): a fork
    keeps its parent's, a fresh exec gets new ones (ASLR)."""
    with open(f"/proc/{pid}/auxv", "rb") as f:
        return f.read()


def _stat(pid: int) -> tuple[str, int]:
    """(comm, ppid)"""
    with open(f"/proc/{pid}/stat") as f:
        head, _, rest = f.read().rpartition(")")
    return head.split("(", 1)[1], int(rest.split()[1])


def _children(pid: int, comm: str | None = None) -> list[int]:
    """`pid`'s children (named `comm` if given); one that exits while we look is left out."""
    out = []
    for p in (int(x) for x in os.listdir("/proc") if x.isdigit()):
        try:
            name, ppid = _stat(p)
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and (comm is None or name == comm):
            out.append(p)
    return out


def test_shims_are_forked_from_the_spawner(cri):
    assert cri.proc is not None
    # husk-cri serves while its zygote may still be importing (it names itself once shim.spawner is loaded):
    # under a loaded test run the socket came first and a look right away found no named child
    zygotes = wait_for(lambda: _children(cri.proc.pid, comm="husk-cri-spawne"),
                       timeout=30, what="husk-cri's spawner child, named husk-cri-spawner")
    assert len(zygotes) == 1, f"husk-cri has {len(zygotes)} spawner children"
    rt = cri.runtime_stub()
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    pod = pod_config(cri, "spawned")
    pod_id = run_pod(rt, pod)
    start_container(rt, pod_id, pod, container_config("c", ["sleep", "3600"]))

    zygote_auxv = _auxv(zygotes[0])
    assert zygote_auxv != _auxv(cri.proc.pid)               # the zygote is a fresh exec, not a fork of husk-cri
    shims = cri.shim_pids()
    assert len(shims) == 1                                  # the pod's: the pause container's serves the container
    for pid in shims:
        comm, ppid = _stat(pid)
        assert comm == "husk-shim"
        cmdline = _cmdline(pid)
        assert "shim.main" not in cmdline, f"shim {pid} was started fresh: {cmdline}"
        assert _auxv(pid) == zygote_auxv, f"shim {pid} is no fork of husk-cri's zygote: {cmdline}"
        assert ppid not in (cri.proc.pid, zygotes[0])         # double-forked: it outlives both
    # husk-cri re-executed itself from the protected interpreter (runtime/exeguard.py) at start-up, so the
    # zygote and every shim inherit it and the in-process runtime never re-executes per container
    from runtime import exeguard
    assert exeguard.is_protected(cri.proc.pid) and exeguard.is_protected(zygotes[0])
    assert all(exeguard.is_protected(pid) for pid in shims)
    log = cri.log()
    assert "shim spawner started" in log
    assert "interpreter is not protected" not in log
    assert not [m for m in FALLBACK_MESSAGES if m in log]

    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    nothing_left(cri)
