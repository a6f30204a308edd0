"""ListPodSandbox and ListContainers answered from per-record encodings (cri_server/rpc/listing.py): the same
answer as building each item, a changed record is encoded again, removed ones are forgotten."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest

from cri_server.api.v1 import api_pb2 as pb
from cri_server.config import Config
from cri_server.context import Services
from cri_server.network.cni import CniManager
from cri_server.oom import OomScorePolicy
from cri_server.rpc import container_status, sandbox_status
from cri_server.rpc.listing import EncodedItems
from cri_server.store.records import ContainerRecord, ContainerState, SandboxRecord, SandboxState
from cri_server.store.store import Store


@pytest.fixture
def svc(tmp_path):
    store = Store(str(tmp_path / "meta.db"))
    s = Services(config=Config(), store=store, cni=CniManager(str(tmp_path), [], str(tmp_path)),
                 oom=OomScorePolicy(-1000))
    for i in range(5):
        store.put_sandbox(SandboxRecord(id=f"sb{i}", name=f"n{i}", pod_name=f"p{i}", pod_uid=f"u{i}",
                                        pod_namespace="ns", attempt=i, state=SandboxState.READY, created_at=i + 1,
                                        labels={"app": "web" if i % 2 else "db", "i": str(i)},
                                        annotations={"a": str(i)}, runtime_handler="runc" if i == 3 else ""))
        store.put_container(ContainerRecord(id=f"c{i}", sandbox_id=f"sb{i}", name=f"cn{i}", container_name="main",
                                            attempt=0, state=ContainerState.RUNNING, created_at=i + 10,
                                            image="busybox", image_ref="sha256:aa", image_id="sha256:bb",
                                            labels={"app": "web" if i % 2 else "db"}, annotations={"h": str(i)}))
    yield s
    store.close()


def _pods(svc, **flt) -> pb.ListPodSandboxResponse:
    req = pb.ListPodSandboxRequest(filter=pb.PodSandboxFilter(**flt)) if flt else pb.ListPodSandboxRequest()
    return asyncio.run(sandbox_status.list_pod_sandbox(svc, req))


def _containers(svc, **flt) -> pb.ListContainersResponse:
    req = pb.ListContainersRequest(filter=pb.ContainerFilter(**flt)) if flt else pb.ListContainersRequest()
    return asyncio.run(container_status.list_containers(svc, req))


def test_lists_equal_items_built_one_by_one(svc):
    for _ in range(2):                  # the second time from the cached encodings
        assert list(_pods(svc).items) == [sandbox_status.to_pod_sandbox(r) for r in svc.store.list_sandboxes()]
        assert list(_containers(svc).containers) == \
            [container_status.to_container(r) for r in svc.store.list_containers()]
    assert [p.id for p in _pods(svc, label_selector={"app": "web"}).items] == ["sb1", "sb3"]
    assert [p.runtime_handler for p in _pods(svc, id="sb3").items] == ["runc"]
    assert [c.id for c in _containers(svc, pod_sandbox_id="sb2").containers] == ["c2"]
    assert [c.id for c in _containers(svc, label_selector={"app": "db"}).containers] == ["c0", "c2", "c4"]


def test_a_changed_record_is_listed_as_it_is_now(svc):
    _pods(svc), _containers(svc)
    sb = svc.store.get_sandbox("sb2")
    svc.store.put_sandbox(dataclasses.replace(sb, state=SandboxState.NOTREADY, labels={"app": "gone"}))
    c = svc.store.get_container("c2")
    svc.store.put_container(dataclasses.replace(c, state=ContainerState.EXITED))
    (p,) = [p for p in _pods(svc).items if p.id == "sb2"]
    assert p.state == pb.SANDBOX_NOTREADY and dict(p.labels) == {"app": "gone"}
    assert [x.id for x in _pods(svc, state=pb.PodSandboxStateValue(state=pb.SANDBOX_NOTREADY)).items] == ["sb2"]
    (x,) = [x for x in _containers(svc).containers if x.id == "c2"]
    assert x.state == pb.CONTAINER_EXITED
    # Records being created are not listed.
    svc.store.put_sandbox(dataclasses.replace(sb, id="sb9", name="n9", state=SandboxState.CREATING))
    assert "sb9" not in [p.id for p in _pods(svc).items]


def test_encodings_of_removed_records_are_dropped():
    recs = [SandboxRecord(id=f"s{i}", name=f"n{i}", pod_name="p", pod_uid="u", pod_namespace="ns", attempt=0,
                          state=SandboxState.READY, created_at=1) for i in range(200)]
    items = EncodedItems(pb.ListPodSandboxResponse, "items", sandbox_status.to_pod_sandbox)
    assert len(items.response(recs, lambda: recs).items) == 200 and len(items) == 200
    live = recs[:10]
    assert [p.id for p in items.response(live, lambda: live).items] == [f"s{i}" for i in range(10)]
    assert len(items) == 10
