"""husk-cri as a process: a client from the generated stubs drives the RPCs phase 1 implements, checks the
status codes of the ones it does not yet, the socket's mode, and a clean SIGTERM shutdown.

Needs no root: every path is under the test's temp dir."""
from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys

import grpc
import pytest

from cri_server.api.v1 import api_pb2 as pb
from cri_server.api.v1 import api_pb2_grpc as rpc
from cri_server.service import PENDING_IMAGE, PENDING_RUNTIME
from tests.support.waiting import wait_for


def _wait_for_socket(proc: subprocess.Popen, path: str, timeout: float = 30.0) -> None:
    def made() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"husk-cri exited {proc.returncode}: {proc.stderr.read().decode()}")
        return os.path.exists(path) and stat.S_ISSOCK(os.lstat(path).st_mode)
    wait_for(made, timeout, f"husk-cri to create its socket {path}")


@pytest.fixture
def daemon(tmp_path):
    sock = str(tmp_path / "run" / "cri.sock")
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    args = [sys.executable, "-m", "cri_server", "--listen", f"unix://{sock}", "--root", str(tmp_path / "root"),
            "--state", str(tmp_path / "state"), "--cni-conf-dir", str(conf_dir), "--cni-bin-dir", "/usr/lib/cni",
            "--log-level", "debug"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for_socket(proc, sock)
        channel = grpc.insecure_channel(f"unix://{sock}")
        yield proc, sock, channel, conf_dir
        channel.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_version_status_runtime_config(daemon):
    proc, sock, channel, conf_dir = daemon
    stub = rpc.RuntimeServiceStub(channel)
    v = stub.Version(pb.VersionRequest(version="v1"))
    assert (v.runtime_name, v.runtime_api_version) == ("husk", "v1")
    assert v.runtime_version and v.version

    st = stub.Status(pb.StatusRequest())
    conds = {c.type: c for c in st.status.conditions}
    assert conds["RuntimeReady"].status is True
    assert conds["NetworkReady"].status is False
    assert conds["NetworkReady"].reason == "NetworkPluginNotReady"
    assert str(conf_dir) in conds["NetworkReady"].message
    assert [h.name for h in st.runtime_handlers] == [""]
    assert not st.info

    # A network config appears: NetworkReady turns true without a restart.
    (conf_dir / "10-test.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "t", "plugins": [{"type": "bridge"}, {"type": "portmap"}]}))
    st = stub.Status(pb.StatusRequest(verbose=True))
    conds = {c.type: c for c in st.status.conditions}
    assert conds["NetworkReady"].status is True, conds["NetworkReady"].message
    assert json.loads(st.info["cni"])["network"] == "t"
    assert json.loads(st.info["config"])["cni"]["conf_dir"] == str(conf_dir)

    # A plugin that is not installed makes the network not ready, and the message names it.
    (conf_dir / "00-bad.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "bad", "plugins": [{"type": "no-such-plugin"}]}))
    conds = {c.type: c for c in stub.Status(pb.StatusRequest()).status.conditions}
    assert conds["NetworkReady"].status is False and "no-such-plugin" in conds["NetworkReady"].message

    rc = stub.RuntimeConfig(pb.RuntimeConfigRequest())
    assert rc.linux.cgroup_driver == pb.CGROUPFS

    stub.UpdateRuntimeConfig(pb.UpdateRuntimeConfigRequest(
        runtime_config=pb.RuntimeConfig(network_config=pb.NetworkConfig(pod_cidr="10.244.1.0/24"))))
    st = stub.Status(pb.StatusRequest(verbose=True))
    assert json.loads(st.info["cni"])["pod_cidr"] == "10.244.1.0/24"
    with pytest.raises(grpc.RpcError) as e:
        stub.UpdateRuntimeConfig(pb.UpdateRuntimeConfigRequest(
            runtime_config=pb.RuntimeConfig(network_config=pb.NetworkConfig(pod_cidr="10.244.1.0/99"))))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "pod_cidr" in e.value.details()


def test_store_backed_rpcs(daemon):
    _, _, channel, _ = daemon
    stub = rpc.RuntimeServiceStub(channel)
    assert list(stub.ListPodSandbox(pb.ListPodSandboxRequest()).items) == []
    assert list(stub.ListContainers(pb.ListContainersRequest(
        filter=pb.ContainerFilter(pod_sandbox_id="x"))).containers) == []
    for call, req in ((stub.PodSandboxStatus, pb.PodSandboxStatusRequest(pod_sandbox_id="nosuch")),
                      (stub.ContainerStatus, pb.ContainerStatusRequest(container_id="nosuch"))):
        with pytest.raises(grpc.RpcError) as e:
            call(req)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND and "nosuch" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.ContainerStatus(pb.ContainerStatusRequest())
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_pending_rpcs_are_unimplemented_with_a_reason(daemon):
    _, _, channel, _ = daemon
    for service, pending in (("RuntimeService", PENDING_RUNTIME), ("ImageService", PENDING_IMAGE)):
        desc = pb.DESCRIPTOR.services_by_name[service]
        for name, why in pending.items():
            m = desc.methods_by_name[name]
            req_cls = getattr(pb, m.input_type.name)
            resp_cls = getattr(pb, m.output_type.name)
            path = f"/runtime.v1.{service}/{name}"
            if m.server_streaming:
                call = channel.unary_stream(path, request_serializer=req_cls.SerializeToString,
                                            response_deserializer=resp_cls.FromString)
                with pytest.raises(grpc.RpcError) as e:
                    list(call(req_cls()))
            else:
                call = channel.unary_unary(path, request_serializer=req_cls.SerializeToString,
                                           response_deserializer=resp_cls.FromString)
                with pytest.raises(grpc.RpcError) as e:
                    call(req_cls())
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED, name
            assert why in e.value.details(), name


def test_socket_mode_and_sigterm(daemon):
    proc, sock, channel, _ = daemon
    assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o660
    rpc.RuntimeServiceStub(channel).Version(pb.VersionRequest())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert not os.path.exists(sock)
    logs = [json.loads(line) for line in proc.stderr.read().decode().splitlines() if line.startswith("{")]
    assert any(r["msg"] == "husk-cri serving" and r["endpoint"] == f"unix://{sock}" for r in logs)
    assert any("stopping" in r["msg"] for r in logs)


def test_socket_appears_only_once_it_listens_with_its_mode(tmp_path):
    """The first moment the socket's path exists, it takes connections and has its configured mode (it is
    bound under another name and renamed into place after the listen and the chmod): before, a client that
    waited for the file could find it refusing connections (gRPC binds, then listens) or still 0600."""
    sock = str(tmp_path / "run" / "cri.sock")
    args = [sys.executable, "-m", "cri_server", "--listen", f"unix://{sock}", "--root", str(tmp_path / "root"),
            "--state", str(tmp_path / "state")]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while True:                   # no sleep: the first look that finds the path counts
            try:
                st = os.lstat(sock)
                break
            except FileNotFoundError:
                if proc.poll() is not None:
                    raise AssertionError(f"husk-cri exited {proc.returncode}: {proc.stderr.read().decode()}")
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660, oct(st.st_mode)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(sock)           # ConnectionRefusedError if it were bound and not yet listening
        assert [n for n in os.listdir(os.path.dirname(sock)) if n != "cri.sock"] == []
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()


def test_second_instance_refuses_a_live_socket(daemon, tmp_path):
    _, sock, _, _ = daemon
    out = subprocess.run([sys.executable, "-m", "cri_server", "--listen", sock, "--root", str(tmp_path / "r2"),
                          "--state", str(tmp_path / "s2")], capture_output=True, timeout=60)
    assert out.returncode == 1
    assert b"another server is listening" in out.stderr
