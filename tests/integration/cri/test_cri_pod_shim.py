"""One shim per pod (containerd's grouping): the pause container's shim serves the pod's containers.

The shim alone (several tasks keyed by id, each with its own processes, files, cgroup and exit; Shutdown ends
it only when no task is left; `containerd-shim-husk-v2 start` joins a container to its sandbox's shim), then
through husk-cri: a pod's containers run in its sandbox's shim (exec, logs, stats, stop, restart of husk-cri),
a killed shim takes only its own pod, and a record from before the grouping (a shim per container) still
recovers and ends (root)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import grpc
import pytest

from cri_server.api.v1 import api_pb2 as pb
from shim import exitfile
from shim import ttrpc_wire as w
from shim.pb import google, husk as huskpb, task_types
from tests.integration.cri.conftest import BUSYBOX
from tests.integration.cri.helpers import (container_config, exec_sync, nothing_left, pod_config, run_pod,
                                           start_container, status, wait_exited, wait_for)
from tests.shim_fixtures import (TOP, cleanup_shim, lifecycle_runtimes, make_bundle, remove_cgroup, runtime_id,
                                 start_shim, unique)
from tests.support import procfs

pytestmark = [pytest.mark.root]
S = task_types.Status




def _opts(**fields) -> google.Any:
    o = huskpb.CreateOptions(**fields)
    return google.Any(type_url=huskpb.CreateOptions.FULL_NAME, value=o.encode())


def _force_delete(runtime: str, root: str, cid: str) -> None:
    if runtime == "husk":
        subprocess.run([sys.executable, "-c", "import sys, runtime.lifecycle as l; l.delete(sys.argv[1], sys.argv[2], "
                        "force=True)", root, cid], cwd=TOP, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        subprocess.run([runtime, "--root", root, "delete", "--force", cid], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    remove_cgroup(f"/hshim-test/{cid}")


# --- the shim alone --------------------------------------------------------------------------------------------

@pytest.fixture(params=lifecycle_runtimes()[:2], ids=runtime_id)
def shim(tmp_path, request):
    s = start_shim(str(tmp_path), request.param)
    yield s
    cleanup_shim(s)


def test_one_shim_serves_several_tasks(tmp_path, shim):
    b, c = unique("hgrp-b"), unique("hgrp-c")
    shim.extra_cleanup += [lambda: _force_delete(shim.runtime, shim.runtime_root, b),
                           lambda: _force_delete(shim.runtime, shim.runtime_root, c)]
    log_b, state_b = tmp_path / "b.log", tmp_path / "b-state"
    first = make_bundle(str(tmp_path), shim.cid, ["sleep", "1000"])
    bundle_b = make_bundle(str(tmp_path), b, ["sh", "-c", "echo hello-b; exec sleep 1000"])
    bundle_c = make_bundle(str(tmp_path), c, ["true"])
    with shim.client() as cl:
        pid_a = cl.Create(id=shim.cid, bundle=first).pid
        cl.Start(id=shim.cid)
        pid_b = cl.Create(id=b, bundle=bundle_b, stdout="attach:", stderr="attach:",
                          options=_opts(log_path=str(log_b), state_dir=str(state_b))).pid
        cl.Start(id=b)
        pid_c = cl.Create(id=c, bundle=bundle_c).pid          # no state_dir: a directory in the shim's
        assert len({pid_a, pid_b, pid_c}) == 3
        with pytest.raises(w.TtrpcError) as e:
            cl.Create(id=b, bundle=bundle_b)
        assert e.value.code == w.ALREADY_EXISTS
        assert (cl.State(id=shim.cid).status, cl.State(id=b).status, cl.State(id=c).status) == \
            (S.RUNNING, S.RUNNING, S.CREATED)
        assert cl.State(id=b).bundle == bundle_b and cl.Connect(id=b).task_pid == pid_b
        wait_for(lambda: "hello-b" in (log_b.read_text() if log_b.exists() else ""), 10, "b's CRI log")
        # each task has its own cgroup (the bundles' cgroupsPath differ), attach socket, exec table
        assert cl.Stats(id=shim.cid).stats.value != b"" and cl.Stats(id=b).stats.value != b""
        assert cl.AttachInfo(id=b).path == str(state_b / "attach.sock")
        assert pid_b in [p.pid for p in cl.Pids(id=b).processes]
        assert pid_b not in [p.pid for p in cl.Pids(id=shim.cid).processes]
        cl.Exec(id=b, exec_id="x", stdout="attach:", spec=google.Any(
            type_url="types.containerd.io/opencontainers/runtime-spec/1/Process",
            value=json.dumps({"args": ["sh", "-c", "exit 4"], "cwd": "/", "env": ["PATH=/bin"],
                              "user": {"uid": 0, "gid": 0}}).encode()))
        with pytest.raises(w.TtrpcError) as e:
            cl.Start(id=shim.cid, exec_id="x")                # exec ids are per task
        assert e.value.code == w.NOT_FOUND
        cl.Start(id=b, exec_id="x")
        assert cl.Wait(id=b, exec_id="x", timeout=30).exit_status == 4
        cl.Delete(id=b, exec_id="x")
        # b ends: its exit file is in its own state dir; the others are untouched
        cl.Kill(id=b, signal=signal.SIGKILL)
        assert cl.Wait(id=b, timeout=30).exit_status == 137
        rec = exitfile.read(str(state_b))
        assert rec is not None and rec.pid == pid_b and rec.exit_status == 137
        assert exitfile.read(shim.state_dir) is None
        cl.Delete(id=b)
        assert exitfile.read(str(state_b)) is None
        with pytest.raises(w.TtrpcError) as e:
            cl.State(id=b)
        assert e.value.code == w.NOT_FOUND
        cl.Shutdown(id=b)                                     # tasks left: the shim stays
        assert cl.State(id=shim.cid).status == S.RUNNING and procfs.alive(pid_a)
        shim.proc.send_signal(signal.SIGTERM)                 # ignored: a task runs
        cl.Kill(id=shim.cid, signal=signal.SIGKILL)
        assert cl.Wait(id=shim.cid, timeout=30).exit_status == 137
        cl.Delete(id=shim.cid)
        cl.Shutdown(id=shim.cid, now=True)                    # `now` for the first task: c still holds the shim
        assert cl.State(id=c).status == S.CREATED
        c_dir = os.path.join(shim.state_dir, c)
        assert os.path.isdir(c_dir)
        cl.Delete(id=c)
        assert not os.path.exists(c_dir)                      # the shim made it, the task's Delete removes it
        cl.Shutdown(id=c)
    assert shim.proc.wait(10) == 0
    assert not os.path.exists(shim.address)


def test_containerd_start_joins_the_sandbox_shim(tmp_path, monkeypatch):
    """`containerd-shim-husk-v2 start` for a container annotated with its sandbox id answers the sandbox's shim
    (containerd-shim-runc-v2's grouping: the socket is derived from the group id)."""
    from shim.client import TaskClient
    from shim.main import socket_address
    runtime = lifecycle_runtimes()[0]
    sb, c = unique("hgrp-sb"), unique("hgrp-c")
    root = str(tmp_path / "runtime-root")
    bundles = {}
    for cid, args in ((sb, ["sleep", "1000"]), (c, ["sh", "-c", "exit 5"])):
        bundle = make_bundle(str(tmp_path), cid, args)
        with open(os.path.join(bundle, "config.json")) as f:
            spec = json.load(f)
        spec["annotations"] = {"io.kubernetes.cri.sandbox-id": sb}
        with open(os.path.join(bundle, "config.json"), "w") as f:
            json.dump(spec, f)
        bundles[cid] = bundle
    env = {**os.environ, "HUSK_SHIM_SOCKET_DIR": str(tmp_path / "s"), "HUSK_SHIM_RUNTIME": runtime,
           "HUSK_SHIM_RUNTIME_ROOT": root, "TTRPC_ADDRESS": ""}
    exe = os.path.join(os.path.dirname(sys.executable), "containerd-shim-husk-v2")
    argv = [exe, "-namespace", "hgrp", "-address", str(tmp_path / "containerd.sock"), "-publish-binary", "/bin/true"]
    def start(cid: str) -> str:
        return subprocess.run([*argv, "-id", cid, "start"], cwd=bundles[cid], env=env, capture_output=True,
                              text=True, timeout=60, check=True).stdout.strip()
    addresses = [start(sb)]
    cl = TaskClient(addresses[0][len("unix://"):])
    shim_pid = cl.Connect(id=sb).shim_pid
    try:
        addresses.append(start(c))
        monkeypatch.setenv("HUSK_SHIM_SOCKET_DIR", env["HUSK_SHIM_SOCKET_DIR"])
        expected = "unix://" + socket_address(str(tmp_path / "containerd.sock"), "hgrp", sb)
        assert addresses == [expected, expected]
        with TaskClient(addresses[1][len("unix://"):]) as again:
            assert again.Connect(id=c).shim_pid == shim_pid       # no second shim was started
        with open(os.path.join(bundles[c], "address")) as f:
            assert f.read() == expected
        cl.Create(id=sb, bundle=bundles[sb])
        cl.Start(id=sb)
        cl.Create(id=c, bundle=bundles[c])
        cl.Start(id=c)
        assert cl.Wait(id=c, timeout=30).exit_status == 5
        rec = exitfile.read(bundles[c])                       # a grouped task's files are in its bundle
        assert rec is not None and rec.exit_status == 5
        cl.Delete(id=c)
        cl.Shutdown(id=c)                                     # as containerd does after each Delete
        assert cl.State(id=sb).status == S.RUNNING
        cl.Kill(id=sb, signal=signal.SIGKILL)
        cl.Wait(id=sb, timeout=30)
        cl.Delete(id=sb)
        cl.Shutdown(id=sb)
        wait_for(lambda: not procfs.alive(shim_pid), 10, "the shim to exit")
    finally:
        cl.close()
        if procfs.alive(shim_pid):
            os.kill(shim_pid, signal.SIGKILL)
        for cid in (sb, c):
            _force_delete(runtime, os.path.join(root, "hgrp"), cid)


def test_concurrent_containerd_starts_of_one_group_make_one_shim(tmp_path):
    """Starts of a pod's containers at once: both found no socket, the second's listen replaced the first's
    socket, and the group got two shims (one unreachable). Now the check and the bind are under a lock."""
    from concurrent.futures import ThreadPoolExecutor
    from shim.client import TaskClient
    sb = unique("hgrp-sb")
    ids = [unique(f"hgrp-c{i}") for i in range(4)]
    bundles = {}
    for cid in ids:
        bundle = make_bundle(str(tmp_path), cid, ["sleep", "1000"])
        with open(os.path.join(bundle, "config.json")) as f:
            spec = json.load(f)
        spec["annotations"] = {"io.kubernetes.cri.sandbox-id": sb}
        with open(os.path.join(bundle, "config.json"), "w") as f:
            json.dump(spec, f)
        bundles[cid] = bundle
    env = {**os.environ, "HUSK_SHIM_SOCKET_DIR": str(tmp_path / "s"), "HUSK_SHIM_RUNTIME": lifecycle_runtimes()[0],
           "HUSK_SHIM_RUNTIME_ROOT": str(tmp_path / "runtime-root"), "TTRPC_ADDRESS": ""}
    exe = os.path.join(os.path.dirname(sys.executable), "containerd-shim-husk-v2")
    argv = [exe, "-namespace", "hgrp", "-address", str(tmp_path / "containerd.sock"), "-publish-binary", "/bin/true"]

    def start(cid: str) -> str:
        return subprocess.run([*argv, "-id", cid, "start"], cwd=bundles[cid], env=env, capture_output=True,
                              text=True, timeout=60, check=True).stdout.strip()
    with ThreadPoolExecutor(len(ids)) as pool:
        addresses = list(pool.map(start, ids))
    pids = set()
    try:
        assert len(set(addresses)) == 1, addresses
        with TaskClient(addresses[0][len("unix://"):]) as cl:
            pids = {cl.Connect(id=cid).shim_pid for cid in ids}
        assert len(pids) == 1 and len(_shims(ids)) == 1, (pids, _shims(ids))
    finally:
        for p in _shims(ids):
            os.kill(p, signal.SIGKILL)


def _shims(ids: list[str]) -> list[int]:
    """The shims titled after one of `ids` (a shim started by containerd is named after its first container)."""
    titles = {f"husk-shim {cid}" for cid in ids}
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _cmdline(int(p)).strip() in titles]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# --- through husk-cri -----------------------------------------------------------------------------------------

def _sandbox_info(rt, pod_id: str) -> dict:
    return json.loads(rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True),
                                          timeout=30).info["info"])


def _container_info(rt, cid: str) -> dict:
    return json.loads(rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True),
                                         timeout=30).info["info"])


def _log_text(rt, cid: str) -> str:
    try:
        with open(status(rt, cid).log_path) as f:
            return f.read()
    except OSError:
        return ""


def _stats_ids(rt) -> set[str]:
    return {s.attributes.id for s in rt.ListContainerStats(pb.ListContainerStatsRequest(), timeout=30).stats
            if s.memory.working_set_bytes.value > 0}


TICKER = ["sh", "-c", "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.1; done"]


def _pull(cri) -> None:
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)


def test_pod_containers_run_in_the_sandbox_shim(cri):
    rt = cri.runtime_stub()
    _pull(cri)
    pod = pod_config(cri, "grouped")
    pod_id = run_pod(rt, pod)
    sb = _sandbox_info(rt, pod_id)
    one = start_container(rt, pod_id, pod, container_config("one", ["sh", "-c", "echo from-one; exec sleep 3600"]))
    two = start_container(rt, pod_id, pod, container_config("two", TICKER))
    infos = [_container_info(rt, cid) for cid in (one, two)]
    assert {i["shimAddress"] for i in infos} == {sb["shimAddress"]}
    assert {int(i["shim_pid"]) for i in infos} == {int(sb["shim_pid"])}
    shim_pid = int(sb["shim_pid"])
    assert cri.shim_pids() == [shim_pid]
    assert procfs.args(shim_pid) == f"husk-shim {pod_id}"
    # exec, logs, stats, log reopening, each for its own container
    assert exec_sync(rt, one, ["cat", "/proc/self/cgroup"]).exit_code == 0
    assert exec_sync(rt, two, ["sh", "-c", "exit 3"]).exit_code == 3
    wait_for(lambda: "from-one" in _log_text(rt, one) and "tick" in _log_text(rt, two), 10, "both logs")
    assert "tick" not in _log_text(rt, one)
    wait_for(lambda: {one, two} <= _stats_ids(rt), 10, "stats of both containers")
    log_two = status(rt, two).log_path
    os.rename(log_two, log_two + ".1")
    rt.ReopenContainerLog(pb.ReopenContainerLogRequest(container_id=two), timeout=30)
    wait_for(lambda: os.path.exists(log_two) and "tick" in open(log_two).read(), 10, "the reopened log")
    # one container stops: the shim stays for the others
    rt.StopContainer(pb.StopContainerRequest(container_id=one, timeout=0), timeout=60)
    assert wait_exited(rt, one).exit_code == 137
    rt.RemoveContainer(pb.RemoveContainerRequest(container_id=one), timeout=60)
    assert not os.path.exists(os.path.join(cri.state, "shims", one))
    assert procfs.alive(shim_pid) and status(rt, two).state == pb.CONTAINER_RUNNING
    assert exec_sync(rt, two, ["true"]).exit_code == 0
    # husk-cri restarts: the grouped tasks are found again through the one shim
    cri.kill9()
    cri.start()
    rt = cri.runtime_stub()
    assert status(rt, two).state == pb.CONTAINER_RUNNING
    assert exec_sync(rt, two, ["echo", "again"]).stdout == b"again\n"
    assert cri.shim_pids() == [shim_pid]
    # the pod stops: the shim ends with its last task
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    assert not procfs.alive(shim_pid)
    assert wait_exited(rt, two).exit_code == 137
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    nothing_left(cri)


def test_a_killed_pod_shim_takes_only_its_pod(cri):
    rt = cri.runtime_stub()
    _pull(cri)
    pods = {}
    for name in ("victim", "bystander"):
        pod = pod_config(cri, name)
        pod_id = run_pod(rt, pod)
        pods[name] = (pod_id, start_container(rt, pod_id, pod, container_config("c", TICKER)))
    (victim_pod, victim), (other_pod, other) = pods["victim"], pods["bystander"]
    victim_shim = int(_sandbox_info(rt, victim_pod)["shim_pid"])
    other_shim = int(_sandbox_info(rt, other_pod)["shim_pid"])
    victim_pid = int(_container_info(rt, victim)["pid"])
    assert victim_shim != other_shim
    os.kill(victim_shim, signal.SIGKILL)
    st = wait_exited(rt, victim)
    assert (st.exit_code, st.reason) == (255, "Unknown"), st
    wait_for(lambda: rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=victim_pod), timeout=30)
             .status.state == pb.SANDBOX_NOTREADY, 30, "the victim pod to be NotReady")
    wait_for(lambda: not procfs.alive(victim_pid), 30, "the orphaned container to be removed by the runtime")
    # the other pod: running, exec, logs growing, stats
    assert procfs.alive(other_shim) and status(rt, other).state == pb.CONTAINER_RUNNING
    assert exec_sync(rt, other, ["echo", "fine"]).stdout == b"fine\n"
    before = _log_text(rt, other).count("tick")
    wait_for(lambda: _log_text(rt, other).count("tick") > before, 10, "the bystander's log to grow")
    wait_for(lambda: other in _stats_ids(rt), 10, "the bystander's stats")
    assert rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=other_pod), timeout=30).status.state == \
        pb.SANDBOX_READY
    for pod_id in (victim_pod, other_pod):
        rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
        rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    nothing_left(cri)


def test_a_container_with_its_own_shim_from_before_grouping_recovers(cri):
    """State an older husk-cri left: the container's task in a shim of its own at <state>/shims/<id>/shim.sock.
    The restarted husk-cri watches it there (exec and logs work), and ends that shim with the container."""
    from cri_server.store.store import Store
    from shim.client import TaskClient
    rt = cri.runtime_stub()
    _pull(cri)
    pod = pod_config(cri, "legacy")
    pod_id = run_pod(rt, pod)
    cid = start_container(rt, pod_id, pod, container_config("c", TICKER))
    pod_shim = _sandbox_info(rt, pod_id)["shimAddress"]
    cri.stop()                                      # SIGTERM: the pod keeps running
    db = os.path.join(cri.root, "metadata.db")
    store = Store(db)
    rec = store.get_container(cid)
    # Move the container's task out of the pod's shim into a shim of its own, as before the grouping.
    with TaskClient(pod_shim[len("unix://"):]) as cl:
        cl.Kill(id=cid, signal=signal.SIGKILL)
        cl.Wait(id=cid, timeout=30)
        cl.Delete(id=cid)
    d = os.path.join(cri.state, "shims", cid)
    sock = os.path.join(d, "shim.sock")
    runtime = "husk" if rec.extra["runtime"] in ("husk", "in-process") else rec.extra["runtime"]
    out = subprocess.run([sys.executable, "-m", "shim.main", "start", "--id", cid, "--address", sock, "--state-dir",
                          d, "--runtime", runtime, "--runtime-root", cri.runtime_root, "--bundle",
                          rec.extra["bundle"], "--log", os.path.join(d, "shim.log")],
                         cwd=TOP, capture_output=True, text=True, timeout=60, check=True)
    legacy_pid = json.loads(out.stdout)["pid"]
    try:
        with TaskClient(sock) as cl:
            pid = cl.Create(id=cid, bundle=rec.extra["bundle"], stdout="attach:", stderr="attach:",
                            options=_opts(log_path=rec.log_path)).pid
            cl.Start(id=cid)
        import dataclasses
        store.put_container(dataclasses.replace(rec, pid=pid, shim_address=f"unix://{sock}",
                                                extra={**rec.extra, "shim_pid": legacy_pid}))
        store.close()
        cri.start()
        rt = cri.runtime_stub()
        assert status(rt, cid).state == pb.CONTAINER_RUNNING
        assert exec_sync(rt, cid, ["echo", "old"]).stdout == b"old\n"
        assert sorted(cri.shim_pids()) == sorted([legacy_pid, int(_sandbox_info(rt, pod_id)["shim_pid"])])
        before = _log_text(rt, cid).count("tick")
        wait_for(lambda: _log_text(rt, cid).count("tick") > before, 10, "the log written by the old shim")
        rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0), timeout=60)
        assert wait_exited(rt, cid).exit_code == 137
        wait_for(lambda: not procfs.alive(legacy_pid), 10, "the container's own shim to end with it")
        assert not os.path.exists(d)
    finally:
        if procfs.alive(legacy_pid):
            os.kill(legacy_pid, signal.SIGKILL)
    with pytest.raises(grpc.RpcError):
        exec_sync(rt, cid, ["true"])
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    nothing_left(cri)
