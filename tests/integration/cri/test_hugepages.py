"""Hugepage limits as kubelet sends them (a limit of 0 for every page size of the node) on a node whose container
cgroups have no hugetlb controller: this development host is hybrid (hugetlb exists only on the cgroup2 mount,
memory/cpu/pids are v1), the shape where containerd's tolerate_missing_hugetlb_controller matters. Root."""
from __future__ import annotations

import grpc
import pytest

from cri_server.api.v1 import api_pb2 as pb
from cri_server.spec.context import hugetlb_controller
from tests.integration.cri.conftest import SANDBOX_IMAGE
from tests.integration.cri.helpers import (container_config, exec_sync, leftovers, pod_config, run_pod,
                                           start_container, status)
from tests.support.cri import CriDaemon

pytestmark = [pytest.mark.root, pytest.mark.e2e,
              pytest.mark.skipif(hugetlb_controller(), reason="this host's container cgroups have hugetlb")]


def _hugepage_container(name: str, limit: int) -> pb.ContainerConfig:
    c = container_config(name, ["sleep", "60"])
    c.linux.resources.memory_limit_in_bytes = 64 << 20
    c.linux.resources.hugepage_limits.add(page_size="2MB", limit=limit)
    return c


def _create(rt, pod_id: str, pod: pb.PodSandboxConfig, config: pb.ContainerConfig) -> str:
    return rt.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod),
                              timeout=60).container_id


def test_zero_limit_is_dropped_and_a_nonzero_one_refused(cri):
    rt = cri.runtime_stub()
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image="docker.io/library/busybox:latest")),
                               timeout=120)
    pod = pod_config(cri)
    pod_id = run_pod(rt, pod)

    cid = start_container(rt, pod_id, pod, _hugepage_container("zero", 0))
    assert status(rt, cid).state == pb.CONTAINER_RUNNING
    assert exec_sync(rt, cid, ["cat", "/proc/self/cgroup"]).exit_code == 0   # really runs
    rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0), timeout=60)
    rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=60)

    before = leftovers(cri)
    with pytest.raises(grpc.RpcError) as e:
        _create(rt, pod_id, pod, _hugepage_container("two-mb", 2 << 20))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("config.linux.resources.hugepage_limits[0].limit: ")
    assert "no hugetlb cgroup controller" in e.value.details()
    assert leftovers(cri) == before
    assert not rt.ListContainers(pb.ListContainersRequest(), timeout=30).containers


def test_not_tolerated_the_runtime_refuses_as_before(tmp_path, pod_network, registry_config_dir):
    d = CriDaemon(str(tmp_path / "strict"), pod_network, registry_config_dir, SANDBOX_IMAGE)
    try:
        with open(d.config_path) as f:
            text = f.read()
        with open(d.config_path, "w") as f:
            f.write(text.replace("[runtime]\n", "[runtime]\ntolerate_missing_hugetlb_controller = false\n", 1))
        d.start()
        rt = d.runtime_stub()
        d.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image="docker.io/library/busybox:latest")),
                                 timeout=120)
        pod = pod_config(d)
        pod_id = run_pod(rt, pod)
        before = leftovers(d)
        with pytest.raises(grpc.RpcError) as e:
            _create(rt, pod_id, pod, _hugepage_container("zero", 0))
        assert e.value.code() != grpc.StatusCode.INVALID_ARGUMENT      # the runtime's failure, not husk-cri's
        assert "hugepageLimits[0]" in e.value.details() and "hugetlb" in e.value.details()
        assert leftovers(d) == before
    finally:
        d.cleanup()
