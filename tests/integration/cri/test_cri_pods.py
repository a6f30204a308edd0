"""husk-cri end to end, driven by a gRPC client from the generated stubs: busybox from a local registry, the
whole pod life cycle, logs (CRI format, reopen), exec, exit codes and reasons, OOM, stats, events, and that
nothing is left behind. Root: real shims, runc, CNI bridge + portmap in names of the test's own."""
from __future__ import annotations

import os
import re
import threading
import time

import grpc
import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX, SANDBOX_IMAGE
from tests.integration.cri.helpers import (container_config, exec_sync, leftovers, nothing_left, pod_config,
                                           run_pod, start_container, status, wait_exited, wait_for)

pytestmark = [pytest.mark.root, pytest.mark.e2e]

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z (stdout|stderr) (F|P) (.*)$")


def _pull(cri, ref: str = BUSYBOX) -> str:
    return cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)), timeout=120).image_ref


def _log_lines(path: str) -> list[tuple[str, str, str]]:
    out = []
    with open(path) as f:
        for line in f.read().splitlines():
            m = LOG_LINE.match(line)
            assert m, f"not a CRI log line: {line!r}"
            out.append(m.groups())
    return out


def test_pod_lifecycle(cri):
    rt, im = cri.runtime_stub(), cri.image_stub()
    image_ref = _pull(cri)
    st = im.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=BUSYBOX))).image
    assert image_ref == st.id and BUSYBOX in st.repo_tags

    pod = pod_config(cri, "life")
    pod_id = run_pod(rt, pod)
    ps = rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True))
    assert ps.status.state == pb.SANDBOX_READY
    assert ps.status.network.ip.startswith(cri.network.subnet_prefix + ".")
    assert ps.status.metadata.name == "life" and ps.status.labels["test"] == "hct"
    assert ps.status.annotations == {"a": "b"} and ps.status.created_at > 0
    assert '"netnsPath"' in ps.info["info"]
    # The sandbox image was pulled on demand from the local registry.
    assert im.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=SANDBOX_IMAGE))).image.id

    cfg = container_config("main", ["sh", "-c", "echo hello; echo oops >&2; "
                                                "while true; do sleep 0.2; done"])
    cid = start_container(rt, pod_id, pod, cfg)
    s = status(rt, cid)
    assert s.state == pb.CONTAINER_RUNNING and s.started_at >= s.created_at > 0
    assert s.image_id == image_ref and s.image_ref == image_ref and s.image.image == BUSYBOX
    assert s.log_path == os.path.join(pod.log_directory, "main.log")
    listed = rt.ListContainers(pb.ListContainersRequest(filter=pb.ContainerFilter(pod_sandbox_id=pod_id)))
    assert [c.id for c in listed.containers] == [cid] and listed.containers[0].image_id == image_ref

    lines = wait_for(lambda: (x := _log_lines(s.log_path)) and len(x) >= 2 and x, what="log lines")
    assert ("stdout", "F", "hello") in lines and ("stderr", "F", "oops") in lines

    # The hostname and the DNS/hosts files of the pod.
    assert exec_sync(rt, cid, ["hostname"]).stdout == b"life\n"
    hosts = exec_sync(rt, cid, ["cat", "/etc/hosts"]).stdout.decode()
    assert ps.status.network.ip in hosts

    # ExecSync: stdout and stderr apart, the exit code, no error for a non-zero exit.
    r = exec_sync(rt, cid, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (r.stdout, r.stderr, r.exit_code) == (b"out\n", b"err\n", 3)
    # A timeout is an error, and the timed-out process is gone; the container keeps running.
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        exec_sync(rt, cid, ["sleep", "4321"], timeout=1)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - t0 < 20
    assert exec_sync(rt, cid, ["sh", "-c", "pgrep sleep | wc -l; true"]).stdout.strip() in (b"0", b"1")
    assert not [p for p in exec_sync(rt, cid, ["ps", "-o", "args"]).stdout.decode().splitlines() if "4321" in p]
    assert status(rt, cid).state == pb.CONTAINER_RUNNING

    # Log rotation: kubelet renames the file and asks for a reopen; new output goes to the new file.
    rotated = s.log_path + ".1"
    os.rename(s.log_path, rotated)
    rt.ReopenContainerLog(pb.ReopenContainerLogRequest(container_id=cid))
    exec_sync(rt, cid, ["sh", "-c", "echo after-rotation > /proc/1/fd/1"])
    wait_for(lambda: os.path.exists(s.log_path) and "after-rotation" in open(s.log_path).read(),
             what="output in the reopened log")
    assert "after-rotation" not in open(rotated).read()

    # Stats.
    stats = rt.ContainerStats(pb.ContainerStatsRequest(container_id=cid)).stats
    assert stats.attributes.id == cid and stats.cpu.timestamp > 0 and stats.memory.timestamp > 0
    assert stats.memory.working_set_bytes.value > 0 and stats.cpu.usage_core_nano_seconds.value > 0
    assert stats.writable_layer.timestamp > 0
    all_stats = rt.ListContainerStats(pb.ListContainerStatsRequest()).stats
    assert [x.attributes.id for x in all_stats] == [cid]
    pstats = rt.PodSandboxStats(pb.PodSandboxStatsRequest(pod_sandbox_id=pod_id)).stats
    assert pstats.linux.network.default_interface.name == "eth0"
    assert [c.attributes.id for c in pstats.linux.containers] == [cid]
    # ListPodSandboxStats: every ready pod, or those the filter names; each like PodSandboxStats.
    (listed_pod,) = rt.ListPodSandboxStats(pb.ListPodSandboxStatsRequest()).stats
    a = listed_pod.attributes
    assert (a.id, a.metadata.name, a.metadata.namespace, a.metadata.uid) == (pod_id, "life", "hct", "uid-life")
    assert a.labels["test"] == "hct" and a.annotations == {"a": "b"}
    lx = listed_pod.linux
    assert lx.cpu.timestamp > 0 and lx.cpu.usage_core_nano_seconds.value > 0
    assert lx.process.process_count.value >= 2                  # pause + the container's shell (and its sleep)
    assert lx.network.timestamp > 0 and lx.network.default_interface.name == "eth0"
    assert lx.network.default_interface.HasField("rx_bytes") and lx.network.default_interface.HasField("tx_bytes")
    (c_stats,) = lx.containers
    assert c_stats.attributes.id == cid and c_stats.attributes.metadata.name == "main"
    assert c_stats.memory.working_set_bytes.value > 0 and c_stats.cpu.usage_core_nano_seconds.value > 0
    # The pod's usage is its pause container's plus its containers' (from the same readings).
    assert lx.memory.working_set_bytes.value >= c_stats.memory.working_set_bytes.value
    assert lx.cpu.usage_core_nano_seconds.value >= c_stats.cpu.usage_core_nano_seconds.value
    by_label = rt.ListPodSandboxStats(pb.ListPodSandboxStatsRequest(
        filter=pb.PodSandboxStatsFilter(label_selector={"test": "hct"}))).stats
    assert [x.attributes.id for x in by_label] == [pod_id]
    for flt in (pb.PodSandboxStatsFilter(label_selector={"test": "other"}), pb.PodSandboxStatsFilter(id="0" * 64)):
        assert not rt.ListPodSandboxStats(pb.ListPodSandboxStatsRequest(filter=flt)).stats
    assert [x.attributes.id for x in rt.ListPodSandboxStats(pb.ListPodSandboxStatsRequest(
        filter=pb.PodSandboxStatsFilter(id=pod_id))).stats] == [pod_id]

    # Stop: SIGTERM (sh as pid 1 ignores it) then SIGKILL after the timeout.
    rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=1), timeout=60)
    s = status(rt, cid)
    assert s.state == pb.CONTAINER_EXITED and s.exit_code == 137 and s.reason == "Error"
    assert s.finished_at >= s.started_at
    assert ("stdout", "F", "after-rotation") in _log_lines(s.log_path)
    rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=1))   # idempotent
    rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid))
    rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid))
    with pytest.raises(grpc.RpcError) as e:
        status(rt, cid)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND

    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))
    assert rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id)).status.state == \
        pb.SANDBOX_NOTREADY
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    assert not rt.ListPodSandbox(pb.ListPodSandboxRequest()).items
    nothing_left(cri)


def test_exit_codes_reasons_and_oom(cri):
    rt = cri.runtime_stub()
    _pull(cri)
    pod = pod_config(cri, "exits")
    pod_id = run_pod(rt, pod)
    ok = start_container(rt, pod_id, pod, container_config("ok", ["true"]))
    bad = start_container(rt, pod_id, pod, container_config("bad", ["sh", "-c", "printf partial; exit 3"]))
    oom_cfg = container_config("oom", ["sh", "-c", "x=0123456789abcdef; while true; do x=$x$x; done"])
    oom_cfg.linux.resources.memory_limit_in_bytes = 15 << 20
    oom_cfg.linux.resources.memory_swap_limit_in_bytes = 15 << 20
    oom = start_container(rt, pod_id, pod, oom_cfg)
    assert (wait_exited(rt, ok).exit_code, status(rt, ok).reason) == (0, "Completed")
    assert (wait_exited(rt, bad).exit_code, status(rt, bad).reason) == (3, "Error")
    # The last line had no newline: written as a partial record when the output ended.
    assert _log_lines(status(rt, bad).log_path) == [("stdout", "P", "partial")]
    s = wait_exited(rt, oom, timeout=60)
    assert (s.exit_code, s.reason) == (137, "OOMKilled")
    assert s.resources.linux.memory_limit_in_bytes == 15 << 20
    exited = rt.ListContainers(pb.ListContainersRequest(filter=pb.ContainerFilter(
        state=pb.ContainerStateValue(state=pb.CONTAINER_EXITED)))).containers
    assert {c.id for c in exited} == {ok, bad, oom}
    # An exited container's shim is gone: one process per running task only (the pause container's).
    assert len(cri.shim_pids()) == 1
    with pytest.raises(grpc.RpcError) as e:
        exec_sync(rt, ok, ["true"])
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    nothing_left(cri)


def test_container_events(cri):
    rt = cri.runtime_stub()
    _pull(cri)
    got: list[pb.ContainerEventResponse] = []
    stream = rt.GetContainerEvents(pb.GetEventsRequest())

    def read() -> None:
        try:
            for ev in stream:
                got.append(ev)
        except grpc.RpcError:
            pass
    reader = threading.Thread(target=read)
    reader.start()
    try:
        pod = pod_config(cri, "events")
        pod_id = run_pod(rt, pod)
        cid = start_container(rt, pod_id, pod, container_config("ev", ["sh", "-c", "exit 0"]))
        wait_exited(rt, cid)
        rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid))
        kinds = wait_for(lambda: (k := [e.container_event_type for e in got if e.container_id == cid])
                         and pb.CONTAINER_DELETED_EVENT in k and k, what="container events")
        assert kinds == [pb.CONTAINER_CREATED_EVENT, pb.CONTAINER_STARTED_EVENT, pb.CONTAINER_STOPPED_EVENT,
                         pb.CONTAINER_DELETED_EVENT]
        created = next(e for e in got if e.container_id == cid)
        assert created.pod_sandbox_status.id == pod_id and created.created_at > 0
        assert [c.id for c in created.containers_statuses] == [cid]
        rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))
        rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    finally:
        stream.cancel()
        reader.join(10)


def test_image_service(cri):
    im = cri.image_stub()
    ref = _pull(cri, "registry.k8s.io/e2e-test-images/busybox:1.29-2")
    assert ref == _pull(cri)        # the same image under another name: one id
    st = im.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=ref), verbose=True))
    assert set(st.image.repo_tags) >= {BUSYBOX, "registry.k8s.io/e2e-test-images/busybox:1.29-2"}
    assert st.image.size > 0 and '"layers"' in st.info["info"]
    uid_ref = _pull(cri, "gcr.io/k8s-staging-cri-tools/test-image-user-uid")
    uid_img = im.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=uid_ref))).image
    assert uid_img.uid.value == 1002 and "gcr.io/k8s-staging-cri-tools/test-image-user-uid:latest" in \
        uid_img.repo_tags
    listed = {i.id for i in im.ListImages(pb.ListImagesRequest()).images}
    assert {ref, uid_ref} <= listed
    fs = im.ImageFsInfo(pb.ImageFsInfoRequest())
    assert fs.image_filesystems[0].used_bytes.value > 0 and fs.image_filesystems[0].timestamp > 0
    assert len(fs.container_filesystems) == 1
    with pytest.raises(grpc.RpcError) as e:
        _pull(cri, "docker.io/library/no-such-image:1")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    im.RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=uid_ref)))
    im.RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=uid_ref)))        # idempotent
    assert not im.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=uid_ref))).HasField("image")


def test_bad_input_leaves_nothing_behind(cri, tmp_path):
    rt = cri.runtime_stub()
    _pull(cri)
    before = leftovers(cri)

    def code(fn, req) -> grpc.StatusCode:
        with pytest.raises(grpc.RpcError) as e:
            fn(req, timeout=60)
        return e.value.code(), e.value.details()

    # Pods: missing metadata, unknown runtime handler, bad port mapping.
    no_md = pb.PodSandboxConfig()
    assert code(rt.RunPodSandbox, pb.RunPodSandboxRequest(config=no_md))[0] == grpc.StatusCode.INVALID_ARGUMENT
    pod = pod_config(cri, "bad")
    c, msg = code(rt.RunPodSandbox, pb.RunPodSandboxRequest(config=pod, runtime_handler="nosuch"))
    assert c == grpc.StatusCode.INVALID_ARGUMENT and "nosuch" in msg
    bad_port = pod_config(cri, "badport")
    bad_port.port_mappings.add(container_port=70000)
    assert code(rt.RunPodSandbox, pb.RunPodSandboxRequest(config=bad_port))[0] == grpc.StatusCode.INVALID_ARGUMENT
    # A failure deep inside (the runtime refuses a sysctl that does not exist): everything undone.
    bad_sysctl = pod_config(cri, "badsysctl")
    bad_sysctl.linux.sysctls["net.hct.no_such_sysctl"] = "1"
    assert code(rt.RunPodSandbox, pb.RunPodSandboxRequest(config=bad_sysctl))[0] == grpc.StatusCode.INTERNAL
    assert leftovers(cri) == before
    assert not rt.ListPodSandbox(pb.ListPodSandboxRequest()).items

    # Duplicate names: AlreadyExists naming the holder.
    pod_id = run_pod(rt, pod)
    c, msg = code(rt.RunPodSandbox, pb.RunPodSandboxRequest(config=pod))
    assert c == grpc.StatusCode.ALREADY_EXISTS and pod_id in msg
    with_pod = leftovers(cri)

    # Containers: missing metadata, unknown sandbox, image not present, bad mounts, bad log path, duplicates.
    def create(cfg, sandbox=pod_id, timeout=60):
        return rt.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=sandbox, config=cfg, sandbox_config=pod),
                                  timeout=timeout)
    assert code(create, container_config("", ["true"]))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert code(lambda cfg, timeout: create(cfg, "nosuch", timeout), container_config("x", ["true"]))[0] == \
        grpc.StatusCode.NOT_FOUND
    c, msg = code(create, container_config("x", ["true"], image="docker.io/library/not-pulled:1"))
    assert c == grpc.StatusCode.NOT_FOUND and "not-pulled" in msg
    rel = container_config("m", ["true"])
    rel.mounts.add(container_path="relative", host_path=str(tmp_path))
    assert code(create, rel)[0] == grpc.StatusCode.INVALID_ARGUMENT
    prop = container_config("m", ["true"])
    prop.mounts.add(container_path="/data", host_path=str(tmp_path), propagation=pb.PROPAGATION_BIDIRECTIONAL)
    c, msg = code(create, prop)
    assert c == grpc.StatusCode.INVALID_ARGUMENT and "propagation" in msg
    escape = container_config("m", ["true"])
    escape.log_path = "../../escape.log"
    assert code(create, escape)[0] == grpc.StatusCode.INVALID_ARGUMENT
    no_cmd_image = container_config("m", [])
    no_cmd_image.image.image = "registry.k8s.io/pause:3.9-husk"
    no_cmd_image.linux.security_context.run_as_group.value = 5
    assert code(create, no_cmd_image)[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert leftovers(cri) == with_pod

    cid = create(container_config("dup", ["sleep", "60"])).container_id
    c, msg = code(create, container_config("dup", ["sleep", "60"]))
    assert c == grpc.StatusCode.ALREADY_EXISTS and cid in msg

    # Unknown ids: NotFound for status calls, success for stop and remove.
    for fn, req in ((rt.PodSandboxStatus, pb.PodSandboxStatusRequest(pod_sandbox_id="0" * 64)),
                    (rt.ContainerStatus, pb.ContainerStatusRequest(container_id="0" * 64)),
                    (rt.StartContainer, pb.StartContainerRequest(container_id="0" * 64)),
                    (rt.ContainerStats, pb.ContainerStatsRequest(container_id="0" * 64))):
        assert code(fn, req)[0] == grpc.StatusCode.NOT_FOUND
    rt.StopContainer(pb.StopContainerRequest(container_id="0" * 64))
    rt.RemoveContainer(pb.RemoveContainerRequest(container_id="0" * 64))
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id="0" * 64))
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id="0" * 64))
    # Exec in a container that is not running.
    assert code(rt.ExecSync, pb.ExecSyncRequest(container_id=cid, cmd=["true"]))[0] == \
        grpc.StatusCode.FAILED_PRECONDITION

    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    nothing_left(cri)


def test_runtime_handler_and_resource_update(cri):
    """A pod on the `runc` RuntimeClass handler; UpdateContainerResources changes its cgroup at once."""
    rt = cri.runtime_stub()
    _pull(cri)
    handlers = [h.name for h in rt.Status(pb.StatusRequest()).runtime_handlers]
    assert handlers == ["", "runc"]
    pod = pod_config(cri, "handler")
    pod_id = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod, runtime_handler="runc")).pod_sandbox_id
    assert rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id)).status.runtime_handler == "runc"
    cfg = container_config("limited", ["sleep", "3600"])
    cfg.linux.resources.memory_limit_in_bytes = 100 << 20
    cid = start_container(rt, pod_id, pod, cfg)
    memory = f"/sys/fs/cgroup/memory{cri.cgroup_parent}/{cid}/memory.limit_in_bytes"
    shares = f"/sys/fs/cgroup/cpu{cri.cgroup_parent}/{cid}/cpu.shares"
    assert int(open(memory).read()) == 100 << 20
    rt.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
        container_id=cid, linux=pb.LinuxContainerResources(memory_limit_in_bytes=64 << 20, cpu_shares=256)))
    assert (int(open(memory).read()), int(open(shares).read())) == (64 << 20, 256)
    r = status(rt, cid).resources.linux
    assert (r.memory_limit_in_bytes, r.cpu_shares) == (64 << 20, 256)
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    nothing_left(cri)


def test_output_reaches_attach_without_a_log_file(cri):
    """A container without a log path (kubectl attach to it) still has its output read by the shim and sent to
    attached clients; its stdin comes from them. (Before: the output went to /dev/null.)"""
    from shim.attach import AttachClient
    rt = cri.runtime_stub()
    _pull(cri)
    pod = pod_config(cri, "nolog", log_dir="")
    pod.log_directory = ""
    pod_id = run_pod(rt, pod)
    cfg = container_config("echo", ["sh", "-c", "read x; echo got-$x; echo err-$x >&2; read y; exit 0"], stdin=True)
    cfg.log_path = ""
    cid = start_container(rt, pod_id, pod, cfg)
    assert status(rt, cid).log_path == ""
    client = AttachClient(os.path.join(cri.state, "shims", cid, "attach.sock"))
    try:
        client.write_stdin(b"hi\n")
        out = err = b""
        while b"got-hi" not in out or b"err-hi" not in err:
            kind, data = client.read()
            out, err = (out + data, err) if kind == 1 else (out, err + data if kind == 2 else err)
        client.close_stdin()
        assert wait_exited(rt, cid).exit_code == 0
    finally:
        client.close()
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    nothing_left(cri)


def test_exec_through_the_streaming_server(cri):
    """Exec's URL leads to the streaming server, whose backend runs the command through the shim (SPDY, as
    kubelet and crictl use it); ExecSync's timeout kills a shell's children too (its process group)."""
    import asyncio

    from tests.streaming_support.spdy_client import spdy_exec
    rt = cri.runtime_stub()
    _pull(cri)
    pod = pod_config(cri, "stream")
    pod_id = run_pod(rt, pod)
    cid = start_container(rt, pod_id, pod, container_config("c", ["sleep", "3600"]))
    url = rt.Exec(pb.ExecRequest(container_id=cid, cmd=["sh", "-c", "cat; echo out; echo err >&2; exit 4"],
                                 stdin=True, stdout=True, stderr=True)).url
    assert url.startswith("http://127.0.0.1:")
    r = asyncio.run(spdy_exec(url, stdin=b"in\n", stdout=True, stderr=True))
    assert (r.stdout, r.stderr) == (b"in\nout\n", b"err\n")
    assert b"NonZeroExitCode" in r.error and b"4" in r.error
    with pytest.raises(grpc.RpcError) as e:
        exec_sync(rt, cid, ["sh", "-c", "sleep 4321; true"], timeout=1)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert b"4321" not in exec_sync(rt, cid, ["ps", "-o", "args"]).stdout
    with pytest.raises(grpc.RpcError) as e:
        rt.Exec(pb.ExecRequest(container_id="0" * 64, cmd=["true"], stdout=True))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert rt.PortForward(pb.PortForwardRequest(pod_sandbox_id=pod_id, port=[80])).url.startswith("http://")
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    nothing_left(cri)
