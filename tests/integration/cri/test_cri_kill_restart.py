"""kill -9 of husk-cri in the middle of StartContainer and CreateContainer, then a restart on the same root
and state: every record must match reality (process alive <=> RUNNING with startedAt; exited => EXITED with
its exit code; shim gone => EXITED 255 Unknown, pod NotReady), a retried StartContainer must not harm a
running container, and the pod must stop and go away leaving nothing behind.

The kill lands deterministically: the container's init is SIGSTOPped before StartContainer, so the shim's
Start blocks inside the runtime's `start` (the init cannot take its release: fifo or socket) until the test, having
killed husk-cri, lets it go on (SIGCONT); the shim is known to be inside Start when its event loop stays
blocked outside its epoll wait. CreateContainer is frozen (SIGSTOP, then SIGKILL) the moment a
step's trace appears on disk: the bundle, the shim's directory, the runtime's container directory."""
from __future__ import annotations

import json
import os
import signal

import grpc
import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX
from tests.integration.cri.helpers import (container_config, leftovers, nothing_left, pod_config, run_pod,
                                           start_container, status, wait_exited, wait_for)
from tests.support import procfs

pytestmark = [pytest.mark.root, pytest.mark.e2e]


def _setup(cri):
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    rt = cri.runtime_stub()
    pod = pod_config(cri)
    return rt, pod, run_pod(rt, pod)


def _create(rt, pod_id, pod, name, cmd) -> str:
    return rt.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=container_config(name, cmd),
                                                        sandbox_config=pod), timeout=60).container_id


def _info(rt, cid) -> dict:
    resp = rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True), timeout=30)
    return json.loads(resp.info["info"])




def _blocked_outside_its_loop(shim_pid: int):
    """A predicate: the shim's (single-threaded) loop has been blocked somewhere other than its epoll wait
    for 5 samples in a row: it is inside a Start, waiting for the runtime (in-process: reading the start
    channel; a runtime binary: waiting for `start`). Independent of how the runtime releases its init."""
    streak = [0]

    def pred() -> bool:
        try:
            with open(f"/proc/{shim_pid}/wchan") as f:
                wchan = f.read().strip()
        except OSError:
            wchan = ""
        streak[0] = streak[0] + 1 if wchan not in ("", "0", "do_epoll_wait", "ep_poll") else 0
        return streak[0] >= 5
    return pred


def _kill_during_start(cri, rt, cid: str) -> int:
    """StartContainer with husk-cri killed while the shim's Start is in the runtime; the start then completes
    with nobody listening. Returns the container's init pid."""
    info = _info(rt, cid)
    pid, shim_pid = int(info["pid"]), int(info["shim_pid"])
    os.kill(pid, signal.SIGSTOP)
    try:
        fut = rt.StartContainer.future(pb.StartContainerRequest(container_id=cid), timeout=60)
        wait_for(_blocked_outside_its_loop(shim_pid), 30, "the shim's Start to reach the runtime", interval=0.005)
        cri.kill9()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert isinstance(fut.exception(timeout=30), grpc.RpcError)
    return pid


def _assert_consistent(rt, cid: str, pid: int) -> pb.ContainerStatus:
    st = status(rt, cid)
    if procfs.alive(pid):
        assert st.state == pb.CONTAINER_RUNNING, st
        assert st.started_at >= st.created_at > 0, st
    else:
        assert st.state == pb.CONTAINER_EXITED, st
        assert st.finished_at > 0, st
    return st


def _remove_pod(rt, cri, pod_id: str) -> None:
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    nothing_left(cri)


def test_killed_during_start_the_process_runs_and_is_reported_running(cri):
    rt, pod, pod_id = _setup(cri)
    cid = _create(rt, pod_id, pod, "sleeper", ["sleep", "3600"])
    pid = _kill_during_start(cri, rt, cid)
    wait_for(lambda: procfs.comm(pid) == "sleep", 30, "the container's process to exec")
    cri.start()
    rt = cri.runtime_stub()
    st = _assert_consistent(rt, cid, pid)
    assert st.state == pb.CONTAINER_RUNNING
    assert int(_info(rt, cid)["pid"]) == pid
    # A retried start (kubelet's) is refused, naming the state, and does not touch the container.
    with pytest.raises(grpc.RpcError) as e:
        rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "running" in e.value.details()
    assert procfs.alive(pid) and status(rt, cid).state == pb.CONTAINER_RUNNING
    rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0), timeout=60)
    assert wait_exited(rt, cid).exit_code == 137
    assert not procfs.alive(pid)
    _remove_pod(rt, cri, pod_id)


def test_killed_during_start_the_process_exits_while_husk_cri_is_away(cri):
    rt, pod, pod_id = _setup(cri)
    cid = _create(rt, pod_id, pod, "quick", ["sh", "-c", "exit 3"])
    pid = _kill_during_start(cri, rt, cid)
    wait_for(lambda: not procfs.alive(pid), 30, "the container's process to exit")
    cri.start()
    rt = cri.runtime_stub()
    st = _assert_consistent(rt, cid, pid)
    assert (st.state, st.exit_code, st.reason) == (pb.CONTAINER_EXITED, 3, "Error")
    assert st.finished_at >= st.started_at > 0, st   # it did start
    with pytest.raises(grpc.RpcError) as e:
        rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "exited" in e.value.details()
    assert status(rt, cid).exit_code == 3
    _remove_pod(rt, cri, pod_id)


def test_shims_gone_while_husk_cri_is_away(cri):
    """Both shims SIGKILLed too: the container is EXITED 255 Unknown, the pod NotReady, and what the shims
    left running (the pause and the container's processes) is gone."""
    rt, pod, pod_id = _setup(cri)
    cid = start_container(rt, pod_id, pod, container_config("sleeper", ["sleep", "3600"]))
    info = _info(rt, cid)
    pid = int(info["pid"])
    sb_info = json.loads(rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True),
                                             timeout=30).info["info"])
    pause = int(sb_info["pid"])
    cri.kill9()
    for shim in cri.shim_pids():
        os.kill(shim, signal.SIGKILL)
    wait_for(lambda: not cri.shim_pids(), 30, "the shims to die")
    cri.start()
    rt = cri.runtime_stub()
    st = status(rt, cid)
    assert (st.state, st.exit_code, st.reason) == (pb.CONTAINER_EXITED, 255, "Unknown"), st
    assert not procfs.alive(pid) and not procfs.alive(pause)
    ps = rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id), timeout=30).status
    assert ps.state == pb.SANDBOX_NOTREADY
    _remove_pod(rt, cri, pod_id)


def _entries(d: str) -> set[str]:
    try:
        return set(os.listdir(d))
    except FileNotFoundError:
        return set()


@pytest.mark.parametrize("step", ["bundles", "shims", "runtime", "answered"])
def test_killed_during_create_leaves_a_whole_container_or_nothing(cri, step):
    """Frozen the moment CreateContainer's step leaves its trace (the bundle dir; the shim's dir; the
    runtime's container dir; the answer), then killed: after the restart the container is complete and
    starts, or is gone without a trace."""
    rt, pod, pod_id = _setup(cri)
    watch = cri.runtime_root if step in ("runtime", "answered") else os.path.join(cri.state, step)
    before = _entries(watch)
    objects_before = leftovers(cri)
    fut = rt.CreateContainer.future(pb.CreateContainerRequest(
        pod_sandbox_id=pod_id, config=container_config("c", ["sh", "-c", "exit 7"]), sandbox_config=pod),
        timeout=60)
    wait_for(lambda: fut.done() or (step != "answered" and _entries(watch) - before), 30,
             f"a new entry in {watch}", interval=0.002)
    cri.proc.send_signal(signal.SIGSTOP)   # frozen at this step; SIGKILL next
    done_first = fut.done()
    cri.kill9()
    cri.start()
    rt = cri.runtime_stub()
    cs = rt.ListContainers(pb.ListContainersRequest(), timeout=30).containers
    assert len(cs) <= 1, cs
    assert cs or step != "answered", "CreateContainer answered, yet the container is gone"
    if cs:
        assert cs[0].state == pb.CONTAINER_CREATED, cs
        rt.StartContainer(pb.StartContainerRequest(container_id=cs[0].id), timeout=60)
        assert wait_exited(rt, cs[0].id).exit_code == 7
    else:
        assert not done_first, "CreateContainer answered, yet the container is gone"
        # Nothing of the interrupted container is left, while the pod's own objects stay.
        assert leftovers(cri) == objects_before
    _remove_pod(rt, cri, pod_id)
