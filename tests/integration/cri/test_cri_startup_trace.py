"""The start-up trace against a running husk-cri: every step of RunPodSandbox/CreateContainer/StartContainer (the
in-process runtime's own stages included) in the verbose status, `husk-cri trace` prints it, failed creations keep
their error, a step over [trace] slow_step_seconds logs a warning naming the pod and the step."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX, SANDBOX_IMAGE
from tests.integration.cri.helpers import container_config, pod_config, run_pod, start_container
from tests.support.cri import CriDaemon, PodNetwork

pytestmark = [pytest.mark.root]

SANDBOX_STEPS = ("reserve_name", "record", "pod_files", "image", "netns", "cni", "cni.add.bridge",
                 "cni.add.portmap", "rootfs", "spec", "shim_spawn", "runtime_create", "runtime_start")
CONTAINER_STEPS = ("image", "reserve_name", "record", "rootfs", "spec", "runtime_create", "runtime_start")
RUNTIME_STAGES = ("runtime.cgroups", "runtime.cgroup_apply", "runtime.namespaces", "runtime.rootfs",
                  "runtime.pivot_root")


@pytest.fixture
def traced_cri(tmp_path, pod_network: PodNetwork, registry_config_dir: str) -> Iterator[CriDaemon]:
    # A threshold every step passes: each one logs the slow-step warning.
    d = CriDaemon(str(tmp_path), pod_network, registry_config_dir, SANDBOX_IMAGE, runtime="in-process",
                  extra_config="[trace]\nslow_step_seconds = 0.000001\n")
    try:
        d.start()
        yield d
    finally:
        d.cleanup()


def cli(cri: CriDaemon, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "cri_server", "--config", cri.config_path, "trace", *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


def steps(info: Any) -> list[dict[str, Any]]:
    assert "trace" not in json.loads(info["info"])
    return json.loads(info["trace"])["steps"]


def names(st: list[dict[str, Any]]) -> list[str]:
    return [s["name"] for s in st]


def test_trace_of_a_pod_and_its_container(traced_cri: CriDaemon) -> None:
    rt = traced_cri.runtime_stub()
    traced_cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    pod = pod_config(traced_cri)
    pid = run_pod(rt, pod)
    cid = start_container(rt, pid, pod, container_config("c1", ["sleep", "1000"]))

    sb = steps(rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pid, verbose=True), timeout=30).info)
    for want in SANDBOX_STEPS + RUNTIME_STAGES:
        assert want in names(sb), names(sb)
    by_name = {s["name"]: i for i, s in enumerate(sb)}
    assert sb[by_name["cni.add.bridge"]]["parent"] == by_name["cni"]
    assert sb[by_name["image.pull"]]["parent"] == by_name["image"]     # a fresh husk-cri pulls the pause image
    assert sb[by_name["runtime.rootfs"]]["parent"] == by_name["runtime_create"]
    assert not [s for s in sb if s.get("error")]

    ct = steps(rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True), timeout=30).info)
    for want in CONTAINER_STEPS + RUNTIME_STAGES:
        assert want in names(ct), names(ct)

    out = cli(traced_cri, cid[:10])
    assert out.startswith(f"container {cid} hct/{pod.metadata.name}/c1")
    lines = out.splitlines()
    assert any(line.startswith("  runtime.namespaces ") for line in lines)
    assert any(line.startswith("runtime_start ") and "|" in line for line in lines)
    assert "runtime.rootfs" in cli(traced_cri, pid[:12])

    log = traced_cri.log()
    assert "slow sandbox step cni.add.bridge" in log and f"hct/{pod.metadata.name}" in log and pid in log


def test_binary_runc_has_one_runtime_create_step(traced_cri: CriDaemon) -> None:
    rt = traced_cri.runtime_stub()
    pid = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod_config(traced_cri), runtime_handler="runc"),
                           timeout=120).pod_sandbox_id
    sb = steps(rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pid, verbose=True), timeout=30).info)
    assert "runtime_create" in names(sb) and not [n for n in names(sb) if n.startswith("runtime.")]


def test_failed_creations_keep_their_error(traced_cri: CriDaemon) -> None:
    rt = traced_cri.runtime_stub()
    pod = pod_config(traced_cri)
    pid = run_pod(rt, pod)
    with pytest.raises(grpc.RpcError) as e:
        rt.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=pid, sandbox_config=pod,
            config=container_config("nope", ["true"], image="docker.io/library/no-such-image:1")), timeout=60)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    # The runtime refuses a command that does not exist: the runtime_create step holds the runtime's error.
    traced_cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    with pytest.raises(grpc.RpcError):
        rt.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=pid, sandbox_config=pod, config=container_config("noexec", ["/no/such/binary"])),
            timeout=60)

    # A CNI failure: host-local refuses a subnet that is no subnet, so the bridge plugin's ADD fails.
    conf = os.path.join(traced_cri.network.conf_dir, os.listdir(traced_cri.network.conf_dir)[0])
    with open(conf) as f:
        good = f.read()
    doc = json.loads(good)
    doc["plugins"][0]["ipam"]["ranges"] = [[{"subnet": "not-a-subnet"}]]
    with open(conf, "w") as f:
        json.dump(doc, f)
    try:
        with pytest.raises(grpc.RpcError):
            run_pod(rt, pod_config(traced_cri, name="badnet"))
    finally:
        with open(conf, "w") as f:
            f.write(good)

    failed = cli(traced_cri, "--failed").splitlines()
    assert len(failed) == 3, failed
    assert "container" in failed[0] and "image: NotFound" in failed[0] and "no-such-image" in failed[0]
    assert "container" in failed[1] and "runtime_create: Internal" in failed[1] and "/no/such/binary" in failed[1]
    assert "sandbox" in failed[2] and "hct/badnet" in failed[2] and "cni.add.bridge: CniError" in failed[2]
    noexec = cli(traced_cri, failed[1].split()[2])
    assert "  runtime.rootfs " in noexec      # the runtime's stages before the failure are kept
    bad_id = failed[2].split()[2]
    out = cli(traced_cri, bad_id)
    assert "(failed)" in out.splitlines()[0] and "error: CniError" in out
    assert "  cni.add.bridge " in out and "runtime_create" not in out
