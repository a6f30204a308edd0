"""The sandbox image is pinned once a pod uses it, however it got there (pulled by RunPodSandbox, or pulled
before through PullImage), as containerd pins its sandbox image: kubelet's image GC skips pinned images, and
without the pin it removed the pause image whenever no container used it (found by scripts/kubelet-e2e)."""
from __future__ import annotations

import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX, SANDBOX_IMAGE
from tests.integration.cri.helpers import pod_config, run_pod

pytestmark = [pytest.mark.root, pytest.mark.e2e]


def _pinned(cri, ref: str) -> bool:
    st = cri.image_stub().ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=ref)), timeout=30)
    assert st.image.id, f"{ref} not present"
    listed = {i.id: i.pinned for i in cri.image_stub().ListImages(pb.ListImagesRequest(), timeout=30).images}
    assert listed[st.image.id] == st.image.pinned
    return st.image.pinned


def _remove_pod(cri, sid: str) -> None:
    rt = cri.runtime_stub()
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=60)
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=60)


def test_sandbox_image_pulled_by_run_pod_sandbox_is_pinned(cri):
    im = cri.image_stub()
    assert not im.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=SANDBOX_IMAGE)), timeout=30).image.id
    sid = run_pod(cri.runtime_stub(), pod_config(cri))
    assert _pinned(cri, SANDBOX_IMAGE)
    _remove_pod(cri, sid)
    assert _pinned(cri, SANDBOX_IMAGE)  # the pin outlives the pod: kubelet's GC runs when no pod is left


def test_sandbox_image_pulled_before_is_pinned_by_a_pod_and_others_are_not(cri):
    im = cri.image_stub()
    for ref in (SANDBOX_IMAGE, BUSYBOX):
        im.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)), timeout=120)
    assert not _pinned(cri, SANDBOX_IMAGE)  # a plain pull pins nothing
    sid = run_pod(cri.runtime_stub(), pod_config(cri))
    assert _pinned(cri, SANDBOX_IMAGE)
    assert not _pinned(cri, BUSYBOX)
    _remove_pod(cri, sid)
