"""StopContainer's signal through a real husk-cri: the image's StopSignal when the request names none, the
request's over the image's, SIGTERM for an image without one; ContainerStatus.stop_signal reports each as
containerd 2.x does. Each container's shell traps only its expected signal and exits with a code of its own."""
from __future__ import annotations

import json

import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX
from tests.integration.cri.helpers import (container_config, nothing_left, pod_config, run_pod, start_container,
                                           status, wait_for)

pytestmark = [pytest.mark.root, pytest.mark.e2e]

STOPSIGNAL_IMAGE = "docker.io/husk-test/stopsignal:v1"


def _trapping(name: str, signal: str, code: int, image: str) -> pb.ContainerConfig:
    # The shell is pid 1 of its pid namespace: a signal it has no handler for is ignored, so only the trapped
    # one ends it (anything else would end in SIGKILL, 137, after the stop timeout).
    return container_config(name, ["sh", "-c", f"trap 'echo got-{signal}; exit {code}' {signal}; echo ready; "
                                               "while true; do sleep 0.1; done"], image=image)


def test_stop_signal_from_the_image_the_request_or_the_default(cri):
    rt, im = cri.runtime_stub(), cri.image_stub()
    for ref in (STOPSIGNAL_IMAGE, BUSYBOX):
        im.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)), timeout=120)
    info = json.loads(im.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=STOPSIGNAL_IMAGE),
                                                           verbose=True)).info["info"])
    assert info["config"]["StopSignal"] == "SIGUSR1"

    pod = pod_config(cri, "stopsig")
    pod_id = run_pod(rt, pod)
    from_image = _trapping("from-image", "USR1", 41, STOPSIGNAL_IMAGE)
    from_request = _trapping("from-request", "USR2", 42, STOPSIGNAL_IMAGE)
    from_request.stop_signal = pb.SIGUSR2
    default = _trapping("default", "TERM", 43, BUSYBOX)
    cases = [(from_image, pb.SIGUSR1, 41), (from_request, pb.SIGUSR2, 42), (default, pb.SIGTERM, 43)]
    ids = [start_container(rt, pod_id, pod, cfg) for cfg, _, _ in cases]
    for cid, (cfg, signal, code) in zip(ids, cases):
        name = cfg.metadata.name
        s = status(rt, cid)
        assert s.stop_signal == signal, (name, pb.Signal.Name(s.stop_signal))
        # The trap is set once "ready" is in the log.
        wait_for(lambda: "ready" in open(s.log_path).read(), what=f"{name} ready")
        rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=60), timeout=120)
        s = status(rt, cid)
        assert (s.state, s.exit_code, s.reason) == (pb.CONTAINER_EXITED, code, "Error"), name
        assert s.stop_signal == signal and f"got-{pb.Signal.Name(signal)[3:]}" in open(s.log_path).read()
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    nothing_left(cri)
