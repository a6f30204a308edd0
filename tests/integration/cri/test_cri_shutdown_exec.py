"""husk-cri stopped (SIGTERM) while an ExecSync is running: the exec is killed and deleted before husk-cri exits.

The client goes first (CriDaemon.stop closes its channel, which cancels the call), so the ExecSync handler's
cleanup (kill the exec, wait for it, delete it from the shim) runs detached from the call. The pod's shim is
frozen (SIGSTOP) meanwhile and thawed a second after the SIGTERM: until then the cleanup cannot get a reply,
and husk-cri must wait for it (shimexec.drain_closes) instead of ending its loop under it, which left the exec's
process running in the container and its attach socket in the shim."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import threading

import grpc
import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX
from tests.integration.cri.helpers import container_config, pod_config, run_pod, start_container, wait_for
from tests.support import procfs

pytestmark = [pytest.mark.root, pytest.mark.e2e]


def _attach_sockets(cri) -> list[str]:
    return [p for d in (cri.state, cri.root) for p in glob.glob(os.path.join(d, "**", "attach-*.sock"),
                                                                   recursive=True)]


def test_sigterm_during_exec_sync_ends_the_exec_first(cri):
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    rt = cri.runtime_stub()
    pod = pod_config(cri)
    pod_id = run_pod(rt, pod)
    cid = start_container(rt, pod_id, pod, container_config("main", ["sleep", "3600"]))
    info = json.loads(rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True),
                                         timeout=30).info["info"])
    shim_pid = int(info["shim_pid"])
    marker = str(600 + int.from_bytes(os.urandom(2), "big"))   # `sleep <marker>`: this test's exec only
    call = rt.ExecSync.future(pb.ExecSyncRequest(container_id=cid, cmd=["sleep", marker], timeout=300),
                              timeout=330)
    wait_for(lambda: procfs.live_with_args(f"sleep {marker}"), 30, "the exec's process to start")
    assert _attach_sockets(cri), "the exec has no attach socket in its shim"
    proc = cri.proc
    os.kill(shim_pid, signal.SIGSTOP)
    try:
        stopper = threading.Thread(target=cri.stop, name="stop-husk-cri")
        stopper.start()
        assert isinstance(call.exception(timeout=30), grpc.RpcError)   # the channel is closed first
        # husk-cri has its SIGTERM; its exec cleanup cannot reach the frozen shim, so it must not exit yet
        try:
            proc.wait(1.0)
            exited_while_frozen = True
        except subprocess.TimeoutExpired:
            exited_while_frozen = False
    finally:
        os.kill(shim_pid, signal.SIGCONT)
    stopper.join(60)
    assert proc.poll() is not None, "husk-cri did not exit"
    assert not exited_while_frozen, "husk-cri exited before the exec's cleanup could reach the shim"
    assert not procfs.live_with_args(f"sleep {marker}"), "the exec's process outlived husk-cri"
    assert not _attach_sockets(cri), "the exec is still in its shim"
