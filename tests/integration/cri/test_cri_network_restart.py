"""husk-cri's pod network and its restarts: port mapping through bridge + portmap (traffic only on this
machine), two containers of one pod talking over localhost, host network, and kill -9 of husk-cri while pods
run (exits while it was away, a vanished namespace, a dead shim), with RPCs on different pods in parallel."""
from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import urllib.request

import grpc
import pytest

from cri_server.api.v1 import api_pb2 as pb
from cri_server.network import netns
from tests.integration.cri.conftest import BUSYBOX
from tests.integration.cri.helpers import (container_config, exec_sync, nothing_left, pod_config, run_pod,
                                           start_container, status, wait_exited, wait_for)
from tests.support.cri import free_port

pytestmark = [pytest.mark.root, pytest.mark.e2e]

HTTPD = ["sh", "-c", "mkdir -p /www && echo served-by-$(hostname) > /www/index.html && exec httpd -f -p 80 -h /www"]
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _pull(cri) -> None:
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)


def _get(url: str) -> str:
    with _NO_PROXY.open(url, timeout=5) as r:
        return r.read().decode()


def _get_eventually(url: str) -> str:
    return wait_for(lambda: _try_get(url), 30, f"an answer from {url}")


def _try_get(url: str) -> str | None:
    try:
        return _get(url)
    except OSError:
        return None


def test_port_mapping_and_localhost_between_containers(cri):
    rt = cri.runtime_stub()
    _pull(cri)
    host_port = free_port()
    pod = pod_config(cri, "web", port_mappings=[pb.PortMapping(protocol=pb.TCP, container_port=80,
                                                               host_port=host_port, host_ip="127.0.0.1")])
    pod_id = run_pod(rt, pod)
    ip = rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id)).status.network.ip
    web = start_container(rt, pod_id, pod, container_config("httpd", HTTPD))
    client = start_container(rt, pod_id, pod, container_config("client", ["sleep", "3600"]))
    # The host reaches the pod's IP through the bridge, and the host port through portmap.
    assert _get_eventually(f"http://{ip}:80/") == "served-by-web\n"
    assert _get_eventually(f"http://127.0.0.1:{host_port}/") == "served-by-web\n"
    # The other container of the pod reaches the server over localhost (one network namespace).
    r = exec_sync(rt, client, ["wget", "-q", "-O", "-", "http://127.0.0.1:80/"])
    assert (r.exit_code, r.stdout) == (0, b"served-by-web\n")
    assert exec_sync(rt, web, ["hostname"]).stdout == exec_sync(rt, client, ["hostname"]).stdout
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))
    # Stopped: the port mapping and the address are gone.
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", host_port), timeout=2).close()
    assert f"dport {host_port}" not in os.popen("iptables -t nat -S").read().replace("--dport", "dport")
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    nothing_left(cri)


def test_host_network_pod(cri):
    rt = cri.runtime_stub()
    _pull(cri)
    pod = pod_config(cri, "hostnet")
    pod.linux.security_context.namespace_options.network = pb.NODE
    pod_id = run_pod(rt, pod)
    st = rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id)).status
    assert st.linux.namespaces.options.network == pb.NODE and not st.network.ip
    cid = start_container(rt, pod_id, pod, container_config("c", ["sleep", "3600"]))
    own = os.readlink("/proc/self/ns/net")
    pid = int(exec_sync(rt, cid, ["sh", "-c", "echo $$"]).stdout or b"0")
    assert pid > 0
    links = exec_sync(rt, cid, ["cat", "/proc/net/dev"]).stdout.decode()
    assert cri.network.bridge in links or "lo:" in links
    assert own == os.readlink("/proc/self/ns/net")
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    nothing_left(cri)


def test_kill9_restart_keeps_pods_and_learns_exits(cri):
    rt = cri.runtime_stub()
    _pull(cri)
    pods = {}
    for name in ("keep", "lose-net", "lose-pause"):
        cfg = pod_config(cri, name)
        pods[name] = (run_pod(rt, cfg), cfg)
    keep_id, keep_cfg = pods["keep"]
    runner = start_container(rt, keep_id, keep_cfg, container_config("runner", ["sleep", "3600"]))
    quitter = start_container(rt, keep_id, keep_cfg, container_config(
        "quitter", ["sh", "-c", "while [ ! -e /tmp/go ]; do sleep 0.1; done; exit 5"]))
    created = rt.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=keep_id, sandbox_config=keep_cfg,
                                                           config=container_config("later", ["sleep", "60"]))
                                 ).container_id
    ready_before = {p.id for p in rt.ListPodSandbox(pb.ListPodSandboxRequest()).items}

    cri.kill9()
    # While husk-cri is away: a container exits, a pod's network namespace vanishes, a pause dies with its shim.
    quitter_init = _init_pid(cri, quitter)
    open(os.path.join(_rootfs(cri, quitter), "tmp", "go"), "w").close()
    lose_net = pods["lose-net"][0]
    netns.remove(os.path.join(cri.state, "netns", lose_net))
    lose_pause = pods["lose-pause"][0]
    _kill_shim_and_task(cri, lose_pause)
    wait_for(lambda: _exited(quitter_init), 30, "the quitter to exit while husk-cri is away")

    cri.start()
    rt = cri.runtime_stub()
    assert {p.id for p in rt.ListPodSandbox(pb.ListPodSandboxRequest()).items} == ready_before
    states = {p.id: p.state for p in rt.ListPodSandbox(pb.ListPodSandboxRequest()).items}
    assert states[keep_id] == pb.SANDBOX_READY
    assert states[lose_net] == pb.SANDBOX_NOTREADY
    wait_for(lambda: rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=lose_pause)).status.state
             == pb.SANDBOX_NOTREADY, what="the sandbox without its pause to be NotReady")
    s = wait_exited(rt, quitter)
    assert (s.exit_code, s.reason) == (5, "Error")
    assert status(rt, runner).state == pb.CONTAINER_RUNNING
    assert exec_sync(rt, runner, ["echo", "still-here"]).stdout == b"still-here\n"
    # A container created before the crash starts after it.
    rt.StartContainer(pb.StartContainerRequest(container_id=created))
    assert status(rt, created).state == pb.CONTAINER_RUNNING

    # RPCs on different pods run in parallel; the same pod's are serialised.
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        list(ex.map(lambda pid: (rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pid)),
                                 rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pid))),
                    [keep_id, lose_net, lose_pause, keep_id]))
    assert not rt.ListPodSandbox(pb.ListPodSandboxRequest()).items
    nothing_left(cri)


def test_sigterm_leaves_pods_running(cri):
    rt = cri.runtime_stub()
    _pull(cri)
    pod = pod_config(cri, "term")
    pod_id = run_pod(rt, pod)
    cid = start_container(rt, pod_id, pod, container_config("c", ["sleep", "3600"]))
    shims = sorted(cri.shim_pids())
    log_start = len(cri.log())
    cri.stop()  # SIGTERM with no RPC in flight
    assert cri.proc.returncode == 0
    assert sorted(cri.shim_pids()) == shims and len(shims) == 1     # the pod's shim serves its container
    # Every close ran (gRPC server, shims' connections, databases) before the process ended without the
    # interpreter's teardown (issue 19 item 5a: cri_server/daemon.py run_loop and exit_now).
    stop_log = cri.log()[log_start:]
    assert "husk-cri stopping" in stop_log and stop_log.count("husk-cri stopped") == 1, stop_log
    assert "Traceback" not in stop_log, stop_log
    cri.start()
    rt = cri.runtime_stub()
    assert status(rt, cid).state == pb.CONTAINER_RUNNING
    with pytest.raises(grpc.RpcError) as e:
        rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod))
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS and pod_id in e.value.details()
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    nothing_left(cri)


def _rootfs(cri, cid: str) -> str:
    return os.path.join(cri.state, "bundles", cid, "rootfs")


def _init_pid(cri, object_id: str) -> int:
    with open(os.path.join(cri.state, "shims", object_id, "init.pid")) as f:
        return int(f.read().strip())


def _exited(pid: int) -> bool:
    """Gone, or a zombie its shim has yet to reap."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _kill_shim_and_task(cri, object_id: str) -> None:
    """SIGKILL the shim serving `object_id` (cwd = its bundle) and the task's init."""
    bundle = os.path.join(cri.state, "bundles", object_id)
    init = _init_pid(cri, object_id)
    for pid in cri.shim_pids():
        if os.readlink(f"/proc/{pid}/cwd") == bundle:
            os.kill(pid, signal.SIGKILL)
    os.kill(init, signal.SIGKILL)
