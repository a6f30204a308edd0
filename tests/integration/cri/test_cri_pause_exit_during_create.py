"""The pod's pause exits while CreateContainer is in flight (one shim per pod: the pause's shim serves the
container too). The sandbox's exit watcher must not try to end a shim that a container's create is using
(before the fix: the shim refused, the watcher waited 5 s for it to go, "shim still alive after shutdown"),
the sandbox is NotReady with its real exit code, and the container is either created in the shim or its
create fails and takes the shim with it; nothing is left after the pod's removal.

The interleaving is forced, not timed: husk-cri is SIGSTOPped, the pause SIGKILLed, and once the shim's Wait
answer sits in husk-cri's receive queue the shim is SIGSTOPped and husk-cri let go. The watcher sends the
sandbox task's Delete (seen queued at the shim), then CreateContainer sends its Create behind it (the queue
grows); the shim then answers both in that order. With the node's network and IPC the container needs none of
the pause's namespaces and its Create succeeds in the shim; with the pod's own, the runtime cannot join the
dead pause's namespaces and the Create fails."""
from __future__ import annotations

import json
import os
import signal

import grpc
import pytest

from cri_server.api.v1 import api_pb2 as pb
from shim import exitfile
from tests.integration.cri.conftest import BUSYBOX
from tests.integration.cri.helpers import (container_config, nothing_left, pod_config, run_pod, shim_queues, status,
                                           wait_for)
from tests.support import procfs

pytestmark = [pytest.mark.root]




def _sandbox_info(rt, pod_id: str) -> dict:
    return json.loads(rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True),
                                          timeout=30).info["info"])


def _create_while_the_pause_exits(cri, rt, pod: pb.PodSandboxConfig, pod_id: str) -> grpc.Future:
    """CreateContainer's future, once the shim has the sandbox task's Delete and then the container's Create
    queued; the shim is let go before returning."""
    info = _sandbox_info(rt, pod_id)
    pause, shim_pid = int(info["pid"]), int(info["shim_pid"])
    shim_dir = os.path.join(cri.state, "shims", pod_id)
    stopped = []
    try:
        cri.proc.send_signal(signal.SIGSTOP)
        stopped.append(cri.proc.pid)
        os.kill(pause, signal.SIGKILL)
        # The shim reaped the pause (exit file) and answered husk-cri's Wait, which husk-cri has not read.
        wait_for(lambda: exitfile.read(shim_dir) is not None and shim_queues(shim_pid)[1] > 0, 30,
                 "the shim's answer to Wait in husk-cri's receive queue", interval=0.01)
        os.kill(shim_pid, signal.SIGSTOP)
        stopped.append(shim_pid)
        cri.proc.send_signal(signal.SIGCONT)
        stopped.remove(cri.proc.pid)
        # The watcher read the exit and asked the (stopped) shim to delete the sandbox's task.
        queued = wait_for(lambda: shim_queues(shim_pid)[0], 30, "the sandbox task's Delete queued at the shim",
                          interval=0.01)
        fut = rt.CreateContainer.future(pb.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=container_config("c", ["sleep", "3600"]), sandbox_config=pod), timeout=60)
        wait_for(lambda: fut.done() or shim_queues(shim_pid)[0] > queued, 30, "the container's Create queued behind it",
                 interval=0.01)
        assert not fut.done(), fut.exception()
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    return fut


def _assert_sandbox_exited_137(rt, pod_id: str) -> None:
    wait_for(lambda: rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id), timeout=30)
             .status.state == pb.SANDBOX_NOTREADY, 30, "the pod to be NotReady")
    ex = _sandbox_info(rt, pod_id)["exit"]
    assert (ex["code"], ex["reason"]) == (128 + signal.SIGKILL, "Error"), ex


def _remove_pod_and_check(cri, rt, pod_id: str) -> None:
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)   # waits for the watchers
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    assert "shim still alive after shutdown" not in cri.log(), "a shim was asked to end while it served a task"
    nothing_left(cri)


def _setup(cri, **pod_fields):
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    rt = cri.runtime_stub()
    pod = pod_config(cri)
    for k, v in pod_fields.items():
        setattr(pod.linux.security_context.namespace_options, k, v)
    return rt, pod, run_pod(rt, pod)


def test_container_created_in_the_shim_of_a_pod_whose_pause_exited(cri):
    rt, pod, pod_id = _setup(cri, network=pb.NODE, ipc=pb.NODE)
    info = _sandbox_info(rt, pod_id)
    fut = _create_while_the_pause_exits(cri, rt, pod, pod_id)
    cid = fut.result(timeout=60).container_id
    # The sandbox's watcher has finished (it logs last); it must not have waited for the shim to go.
    wait_for(lambda: f"task exited id={pod_id}" in cri.log(), 30, "the sandbox's exit watcher to finish")
    assert "shim still alive after shutdown" not in cri.log(), "the watcher asked the shim of a creating task to end"
    _assert_sandbox_exited_137(rt, pod_id)
    assert status(rt, cid).state == pb.CONTAINER_CREATED
    c_info = json.loads(rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True),
                                           timeout=30).info["info"])
    assert c_info["shimAddress"] == info["shimAddress"] and procfs.alive(int(info["shim_pid"]))
    _remove_pod_and_check(cri, rt, pod_id)


def test_create_fails_cleanly_when_the_pause_exited(cri):
    rt, pod, pod_id = _setup(cri)
    shim_pid = int(_sandbox_info(rt, pod_id)["shim_pid"])
    fut = _create_while_the_pause_exits(cri, rt, pod, pod_id)
    assert isinstance(fut.exception(timeout=60), grpc.RpcError)
    _assert_sandbox_exited_137(rt, pod_id)
    assert not rt.ListContainers(pb.ListContainersRequest(), timeout=30).containers
    wait_for(lambda: not procfs.alive(shim_pid), 30, "the pod's shim to end with its last task")
    _remove_pod_and_check(cri, rt, pod_id)
