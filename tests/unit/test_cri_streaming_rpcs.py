"""Exec/Attach/PortForward validation and the StreamTargets husk-cri gives the streaming backend, from a store
with records in every state (no daemon, no shim)."""
from __future__ import annotations

import asyncio
import time

import pytest

from cri_server.api.v1 import api_pb2 as pb
from cri_server.config import Config
from cri_server.context import Services
from cri_server.errors import FailedPrecondition, NotFound, Unimplemented
from cri_server.network.cni import CniManager
from cri_server.oom import OomScorePolicy
from cri_server.rpc import streaming
from cri_server.store.records import ContainerRecord, ContainerState, SandboxRecord, SandboxState
from cri_server.store.store import Store


class FakeServer:
    def get_exec_url(self, req):
        return f"http://s/exec/{req.container_id}"

    def get_attach_url(self, req):
        return f"http://s/attach/{req.container_id}"

    def get_port_forward_url(self, req):
        return f"http://s/portforward/{req.pod_sandbox_id}"


@pytest.fixture
def svc(tmp_path):
    store = Store(str(tmp_path / "meta.db"))
    s = Services(config=Config(), store=store, cni=CniManager(str(tmp_path), [], str(tmp_path)),
                 oom=OomScorePolicy(-1000))
    now = time.time_ns()
    store.put_sandbox(SandboxRecord(id="sb-ready", name="n1", pod_name="p", pod_uid="u", pod_namespace="ns",
                                    attempt=0, state=SandboxState.READY, created_at=now,
                                    netns_path="/run/x/netns/sb-ready"))
    store.put_sandbox(SandboxRecord(id="sb-host", name="n2", pod_name="p2", pod_uid="u2", pod_namespace="ns",
                                    attempt=0, state=SandboxState.READY, created_at=now))
    store.put_sandbox(SandboxRecord(id="sb-stopped", name="n3", pod_name="p3", pod_uid="u3", pod_namespace="ns",
                                    attempt=0, state=SandboxState.NOTREADY, created_at=now))
    for cid, state, addr, extra in (
            ("c-run", ContainerState.RUNNING, "unix:///s/c-run", {"tty": True, "stdin": True, "stdin_once": True}),
            ("c-exited", ContainerState.EXITED, "", {}),
            ("c-creating", ContainerState.CREATED, "", {"creating": True})):
        store.put_container(ContainerRecord(id=cid, sandbox_id="sb-ready", name=cid, container_name=cid, attempt=0,
                                            state=state, created_at=now, shim_address=addr, extra=extra))
    yield s
    store.close()


def run(coro):
    return asyncio.run(coro)


def test_urls_only_for_running_containers_and_ready_sandboxes(svc):
    svc.streaming = FakeServer()
    assert run(streaming.exec_(svc, pb.ExecRequest(container_id="c-run", cmd=["sh"], stdout=True))).url == \
        "http://s/exec/c-run"
    assert run(streaming.attach(svc, pb.AttachRequest(container_id="c-run", stdout=True))).url == \
        "http://s/attach/c-run"
    assert run(streaming.port_forward(svc, pb.PortForwardRequest(pod_sandbox_id="sb-ready", port=[80]))).url == \
        "http://s/portforward/sb-ready"
    with pytest.raises(NotFound):
        run(streaming.exec_(svc, pb.ExecRequest(container_id="nosuch", cmd=["sh"])))
    with pytest.raises(FailedPrecondition, match="not running"):
        run(streaming.exec_(svc, pb.ExecRequest(container_id="c-exited", cmd=["sh"])))
    with pytest.raises(FailedPrecondition):
        run(streaming.attach(svc, pb.AttachRequest(container_id="c-exited", stdout=True)))
    with pytest.raises(NotFound):
        run(streaming.port_forward(svc, pb.PortForwardRequest(pod_sandbox_id="nosuch")))
    with pytest.raises(FailedPrecondition, match="not ready"):
        run(streaming.port_forward(svc, pb.PortForwardRequest(pod_sandbox_id="sb-stopped")))


def test_without_a_streaming_server_the_rpcs_are_unimplemented(svc):
    with pytest.raises(Unimplemented, match="streaming"):
        run(streaming.exec_(svc, pb.ExecRequest(container_id="c-run", cmd=["sh"], stdout=True)))


def test_store_targets(svc):
    pytest.importorskip("cri_server.streaming.husk_backend", reason="the streaming backend is not in this tree")
    t = streaming.StoreTargets(svc)
    c = run(t.container("c-run"))
    assert (c.container_id, c.shim_address, c.running, c.tty, c.stdin, c.stdin_once) == \
        ("c-run", "unix:///s/c-run", True, True, True, True)
    assert run(t.container("c-exi")).running is False          # a unique prefix works, as with crictl
    assert run(t.container("c-creating")) is None              # still being created: not there yet
    assert run(t.container("nosuch")) is None
    assert run(t.container("c-")) is None                      # ambiguous prefix
    assert run(t.sandbox_netns("sb-ready")) == "/run/x/netns/sb-ready"
    assert run(t.sandbox_netns("sb-host")) == ""
    assert run(t.sandbox_netns("sb-stopped")) is None
    assert run(t.sandbox_netns("nosuch")) is None
