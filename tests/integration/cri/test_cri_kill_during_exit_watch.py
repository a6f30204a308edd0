"""husk-cri SIGKILLed inside a task's exit watcher, between asking the shim to Delete the exited task and
recording the exit: after the restart the container (or the pod's pause) has its real exit code, time and
reason, not EXITED 255 `Unknown` (the shim's Delete removes the task and its exit file, so recovery finds
neither), and nothing is left once the pod is removed.

The interleaving is forced, not timed: husk-cri is SIGSTOPped, the task's init SIGKILLed, and once the shim's
Wait answer sits in husk-cri's receive queue the shim is SIGSTOPped and husk-cri let go. The watcher reads the
exit and sends the Delete (seen queued at the shim); husk-cri is SIGSTOPped again. Then either the shim is let
go and its Delete answer waits unread in husk-cri's queue ("deleted"), or the Delete stays queued
("delete_queued"); husk-cri is SIGKILLed at that point and started again."""
from __future__ import annotations

import json
import os
import signal

import pytest

from cri_server.api.v1 import api_pb2 as pb
from shim import exitfile
from tests.integration.cri.conftest import BUSYBOX
from tests.integration.cri.helpers import (container_config, nothing_left, pod_config, run_pod, shim_queues,
                                           start_container, status, wait_for)

pytestmark = [pytest.mark.root]


def _info(rt, kind: str, object_id: str) -> dict:
    if kind == "sandbox":
        resp = rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=object_id, verbose=True), timeout=30)
    else:
        resp = rt.ContainerStatus(pb.ContainerStatusRequest(container_id=object_id, verbose=True), timeout=30)
    return json.loads(resp.info["info"])


def _kill_cri_after_the_delete(cri, shim_pid: int, task_dir: str, init_pid: int, deleted: bool) -> exitfile.ExitRecord:
    """SIGKILLs `init_pid`, then husk-cri once its watcher sent the task's Delete (and, when `deleted`, once the
    shim carried it out). Returns the shim's exit record of the init, as read before the Delete."""
    stopped: list[int] = []
    try:
        cri.proc.send_signal(signal.SIGSTOP)
        stopped.append(cri.proc.pid)
        os.kill(init_pid, signal.SIGKILL)
        # The shim reaped the init (exit file) and answered husk-cri's Wait, which husk-cri has not read.
        wait_for(lambda: exitfile.read(task_dir) is not None and shim_queues(shim_pid)[1] > 0, 30,
                 "the shim's answer to Wait in husk-cri's receive queue", interval=0.01)
        exit_rec = exitfile.read(task_dir)
        assert exit_rec is not None
        os.kill(shim_pid, signal.SIGSTOP)
        stopped.append(shim_pid)
        cri.proc.send_signal(signal.SIGCONT)
        stopped.remove(cri.proc.pid)
        # The watcher read the exit and asked the (stopped) shim to delete the task.
        wait_for(lambda: shim_queues(shim_pid)[0] > 0, 30, "the task's Delete queued at the shim", interval=0.01)
        cri.proc.send_signal(signal.SIGSTOP)
        stopped.append(cri.proc.pid)
        if deleted:
            os.kill(shim_pid, signal.SIGCONT)
            stopped.remove(shim_pid)
            wait_for(lambda: exitfile.read(task_dir) is None and shim_queues(shim_pid)[1] > 0, 30,
                     "the shim's answer to the Delete in husk-cri's receive queue", interval=0.01)
        stopped.remove(cri.proc.pid)
        cri.kill9()
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    return exit_rec


@pytest.mark.parametrize("kind,point", [("container", "deleted"), ("container", "delete_queued"),
                                        ("sandbox", "deleted")])
def test_exit_survives_a_kill_inside_the_exit_watcher(cri, kind, point):
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    rt = cri.runtime_stub()
    pod = pod_config(cri)
    pod_id = run_pod(rt, pod)
    sb_info = _info(rt, "sandbox", pod_id)
    shim_pid = int(sb_info["shim_pid"])
    if kind == "container":
        object_id = start_container(rt, pod_id, pod, container_config("sleeper", ["sleep", "3600"]))
        init_pid = int(_info(rt, kind, object_id)["pid"])
    else:
        object_id, init_pid = pod_id, int(sb_info["pid"])
    task_dir = os.path.join(cri.state, "shims", object_id)

    exit_rec = _kill_cri_after_the_delete(cri, shim_pid, task_dir, init_pid, deleted=point == "deleted")
    assert exit_rec.exit_status == 128 + signal.SIGKILL
    cri.start()
    rt = cri.runtime_stub()

    if kind == "container":
        st = status(rt, object_id)
        assert (st.state, st.exit_code, st.reason, st.finished_at) == \
            (pb.CONTAINER_EXITED, exit_rec.exit_status, "Error", exit_rec.exited_at_ns), st
        # Recovery finished the watcher's work: the task is deleted and the record lets go of the shim.
        assert _info(rt, kind, object_id)["shimAddress"] == ""
        assert rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id),
                                   timeout=30).status.state == pb.SANDBOX_READY
    else:
        info = _info(rt, kind, pod_id)
        assert info["state"] == "notready" and info["shimAddress"] == "", info
        ex = info["exit"]
        assert (ex["code"], ex["at"], ex["reason"]) == (exit_rec.exit_status, exit_rec.exited_at_ns, "Error"), ex
        wait_for(lambda: shim_pid not in cri.shim_pids(), 30, "the pod's shim to end with its last task")
    assert exitfile.read(task_dir) is None
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    nothing_left(cri)
