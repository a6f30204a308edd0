"""The stats RPCs read a running task's CPU, memory and pids from its cgroup files in husk-cri itself
(cri_server/rpc/cgread.py), not through a ttrpc Stats call to the pod's shim: with the shim stopped (SIGSTOP)
ContainerStats and PodSandboxStats still carry the container's counters. Root: real pods."""
from __future__ import annotations

import json
import os
import signal

import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX
from tests.integration.cri.helpers import container_config, pod_config, run_pod, start_container

pytestmark = [pytest.mark.root, pytest.mark.e2e]


def test_stats_do_not_ask_the_shim(cri):
    rt = cri.runtime_stub()
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    pod = pod_config(cri, "cgstats")
    pod_id = run_pod(rt, pod)
    cid = start_container(rt, pod_id, pod, container_config("busy", ["sh", "-c", "while true; do :; done"]))
    info = json.loads(rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True),
                                          timeout=30).info["info"])
    shim_pid = int(info["shim_pid"])
    os.kill(shim_pid, signal.SIGSTOP)
    try:
        # A shim that does not answer would make these wait for its call's timeout and leave the counters out.
        s = rt.ContainerStats(pb.ContainerStatsRequest(container_id=cid), timeout=10).stats
        assert s.cpu.usage_core_nano_seconds.value > 0 and s.memory.usage_bytes.value > 0
        assert s.memory.working_set_bytes.value > 0
        p = rt.PodSandboxStats(pb.PodSandboxStatsRequest(pod_sandbox_id=pod_id), timeout=10).stats
        assert p.linux.cpu.usage_core_nano_seconds.value > 0 and p.linux.process.process_count.value >= 1
        assert [c.attributes.id for c in p.linux.containers] == [cid]
    finally:
        os.kill(shim_pid, signal.SIGCONT)
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
