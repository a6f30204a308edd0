"""Hostile strings in CRI requests against a running husk-cri: InvalidArgument naming the field, refused before
anything is created (no netns, CNI call, shim, bundle or store record), and huge annotations refused so that
listing keeps working for everyone."""
from __future__ import annotations

import os
import sqlite3

import grpc
import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.helpers import (container_config, exec_sync, leftovers, nothing_left, pod_config,
                                           run_pod, start_container, status)

pytestmark = pytest.mark.root

# What husk-cri logs (at debug) when it creates something for a pod: none of it may appear for a refused request.
CREATION_LOGS = ("network namespace pinned", "CNI plugin ran", "pod sandbox ready",
                 "container created")


def _records(cri) -> tuple[int, int]:
    db = sqlite3.connect(f"file:{os.path.join(cri.root, 'metadata.db')}?mode=ro", uri=True)
    try:
        return tuple(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("sandboxes", "containers"))
    finally:
        db.close()


def _refused(cri, call, request, field: str, reason: str) -> None:
    """`call(request)` fails with InvalidArgument naming `field`, and husk-cri created nothing meanwhile."""
    records, before, log_at = _records(cri), leftovers(cri), len(cri.log())
    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert e.value.details().startswith(f"{field}: ") and reason in e.value.details(), e.value.details()
    assert "Traceback" not in cri.log()[log_at:]
    assert not [w for w in CREATION_LOGS if w in cri.log()[log_at:]], cri.log()[log_at:]
    assert leftovers(cri) == before
    assert _records(cri) == records


def _hostile_pods(cri) -> list[tuple[pb.PodSandboxConfig, str, str]]:
    cases = []

    def case(field: str, reason: str, **changes) -> None:
        c = pod_config(cri)
        for path, value in changes.items():
            obj, _, name = path.rpartition("__")
            target = c
            for part in filter(None, obj.split("__")):
                target = getattr(target, part)
            if isinstance(value, dict):
                getattr(target, name).update(value)
            elif isinstance(value, list):
                getattr(target, name).extend(value)
            else:
                setattr(target, name, value)
        cases.append((c, field, reason))

    case("config.metadata.name", "NUL", metadata__name="web\0x")
    case("config.metadata.namespace", "NUL", metadata__namespace="ns\0")
    case("config.metadata.uid", "characters, at most 253", metadata__uid="u" * 300)
    case("config.hostname", "10000 characters, at most 64", hostname="h" * 10000)
    case("config.log_directory", "NUL", log_directory="/var/log/pods/x\0y")
    case("config.dns_config.searches[0]", "NUL", dns_config__searches=["svc\0.local"])
    case("config.labels['app']", "NUL", labels={"app": "w\0"})
    case("config.annotations", "at most 278528", annotations={f"k{i}": "v" * 1024 for i in range(300)})
    case("config.linux.sysctls['net.ipv4.ip_forward']", "NUL", linux__sysctls={"net.ipv4.ip_forward": "1\0"})
    case("config.linux.cgroup_parent", "NUL", linux__cgroup_parent="/hct\0")
    return cases


def test_hostile_run_pod_sandbox_creates_nothing(cri):
    rt = cri.runtime_stub()
    for config, field, reason in _hostile_pods(cri):
        _refused(cri, rt.RunPodSandbox, pb.RunPodSandboxRequest(config=config), field, reason)
    nothing_left(cri)


def test_hostile_create_container_and_exec_create_nothing(cri):
    rt = cri.runtime_stub()
    cri.image_stub().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=container_config("x", []).image.image)),
                               timeout=120)
    pod = pod_config(cri)
    pod_id = run_pod(rt, pod)
    cid = start_container(rt, pod_id, pod, container_config("main", ["sh", "-c", "sleep 600"]))

    def create(field: str, reason: str, edit) -> None:
        c = container_config("bad", ["true"])
        edit(c)
        _refused(cri, rt.CreateContainer, pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=c,
                                                                    sandbox_config=pod), field, reason)

    create("config.log_path", "NUL", lambda c: setattr(c, "log_path", "bad\0.log"))
    create("config.args[1]", "NUL", lambda c: c.args.extend(["-c", "echo\0"]))
    create("config.envs[0].value", "NUL", lambda c: c.envs.add(key="A", value=b"1\0"))
    create("config.envs[0].key", "NUL", lambda c: c.envs.add(key="A\0", value=b"1"))
    create("config.working_dir", "characters, at most 4096", lambda c: setattr(c, "working_dir", "/" + "w" * 5000))
    create("config.mounts[0].host_path", "NUL", lambda c: c.mounts.add(container_path="/m", host_path="/tmp\0"))
    create("config.annotations", "at most 278528", lambda c: c.annotations.update(big="x" * (10 << 20)))
    create("config.metadata.name", "NUL", lambda c: setattr(c.metadata, "name", "bad\0"))

    for cmd, field in (([], "cmd"), ([""], "cmd[0]"), (["ls", "a\0b"], "cmd[1]")):
        _refused(cri, rt.ExecSync, pb.ExecSyncRequest(container_id=cid, cmd=cmd, timeout=10), field, "")
        _refused(cri, rt.Exec, pb.ExecRequest(container_id=cid, cmd=cmd, stdout=True), field, "")
    assert status(rt, cid).state == pb.CONTAINER_RUNNING
    assert exec_sync(rt, cid, ["echo", "ok"]).stdout == b"ok\n"


def test_huge_annotations_are_refused_and_listing_keeps_working(cri):
    rt = cri.runtime_stub()
    ok = pod_config(cri)
    ok.annotations.update({f"k{i}": "v" * 1000 for i in range(200)})       # 200 kB: within Kubernetes' limit
    ok_id = run_pod(rt, ok)
    for _ in range(2):
        big = pod_config(cri)
        big.annotations["huge"] = "x" * (10 << 20)
        _refused(cri, rt.RunPodSandbox, pb.RunPodSandboxRequest(config=big), "config.annotations", "at most 278528")
    listed = rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items
    assert [p.id for p in listed] == [ok_id] and len(listed[0].annotations) == 201
