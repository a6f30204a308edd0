"""A shim serving several tasks (a pod's): which shim a containerd container joins, where a grouped task's files
go, and when Shutdown ends the shim (no root: no task is created)."""
from __future__ import annotations

import json
import os

import pytest

from shim import ttrpc_wire as w
from shim.main import grouping_id
from shim.pb import google, task as taskpb
from shim.service import Proc, ShimConfig, Task, TaskService
from shim.ttrpc_server import PENDING


def _bundle(tmp_path, annotations) -> str:
    d = tmp_path / "b"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"annotations": annotations}))
    return str(d)


@pytest.mark.parametrize("annotations,expected", [
    ({"io.kubernetes.cri.sandbox-id": "sb"}, "sb"),
    ({"io.containerd.runc.v2.group": "g", "io.kubernetes.cri.sandbox-id": "sb"}, "g"),   # runc v2's order
    ({"io.kubernetes.cri.sandbox-id": ""}, "c"),
    ({}, "c"),
    (None, "c"),
])
def test_grouping_id_from_annotations(tmp_path, annotations, expected):
    assert grouping_id(_bundle(tmp_path, annotations), "c") == expected


def test_grouping_id_without_a_readable_config(tmp_path):
    assert grouping_id(str(tmp_path), "c") == "c"
    (tmp_path / "config.json").write_text("{not json")
    assert grouping_id(str(tmp_path), "c") == "c"


class _Loop:
    def __init__(self) -> None:
        self.later = []

    def call_later(self, delay, fn) -> None:
        self.later.append(fn)


class _Ctx:
    def __init__(self) -> None:
        self.replies = []

    def reply(self, msg) -> None:
        self.replies.append(msg)


def _service(tmp_path, **cfg):
    ended = []
    svc = TaskService(_Loop(), ShimConfig(id="sb", address=str(tmp_path / "s.sock"), state_dir=str(tmp_path / "sb"),
                                          **cfg), None, lambda: ended.append(True))
    return svc, ended


def _add(svc, cid) -> None:
    t = Task(cid, f"/nowhere/{cid}")
    t.init = Proc(cid, "", None, pid=100 + len(svc.tasks))
    svc.tasks[cid] = t


def test_shutdown_waits_for_the_last_task(tmp_path):
    svc, ended = _service(tmp_path)
    _add(svc, "sb")
    _add(svc, "c1")
    ctx = _Ctx()
    # containerd's Shutdown after a Delete: tasks are left, the shim stays
    assert isinstance(svc.Shutdown(ctx, taskpb.ShutdownRequest(id="c1")), google.Empty)
    # `now` lets go of the named task only: another task still holds the shim
    assert isinstance(svc.Shutdown(ctx, taskpb.ShutdownRequest(id="sb", now=True)), google.Empty)
    assert not svc.shutting_down and not svc.loop.later
    del svc.tasks["sb"]
    assert svc.Shutdown(ctx, taskpb.ShutdownRequest(id="c1", now=True)) is PENDING
    assert svc.shutting_down and len(ctx.replies) == 1
    svc.loop.later[0]()
    assert ended == [True]


def test_no_create_once_shutting_down(tmp_path):
    svc, _ = _service(tmp_path)
    assert svc.Shutdown(_Ctx(), taskpb.ShutdownRequest(id="sb")) is PENDING
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text("{}")
    with pytest.raises(w.TtrpcError) as e:
        svc.Create(_Ctx(), taskpb.CreateTaskRequest(id="c1", bundle=str(bundle)))
    assert e.value.code == w.FAILED_PRECONDITION


def test_requests_name_their_task(tmp_path):
    svc, _ = _service(tmp_path)
    _add(svc, "sb")
    with pytest.raises(w.TtrpcError) as e:
        svc.State(_Ctx(), taskpb.StateRequest(id="c1"))
    assert e.value.code == w.NOT_FOUND and "c1" in e.value.message
    with pytest.raises(w.TtrpcError) as e:
        svc.Create(_Ctx(), taskpb.CreateTaskRequest(id="../x", bundle=str(tmp_path)))
    assert e.value.code == w.INVALID_ARGUMENT


def test_where_a_grouped_task_keeps_its_files(tmp_path):
    svc, _ = _service(tmp_path)
    assert svc._state_dir("sb", "", "/b/sb") == (str(tmp_path / "sb"), False)           # the shim's own
    d, made = svc._state_dir("c1", str(tmp_path / "given"), "/b/c1")                  # husk-cri's choice
    assert (d, made) == (str(tmp_path / "given"), True) and os.path.isdir(d)
    assert svc._state_dir("c2", "", "/b/c2") == (str(tmp_path / "sb" / "c2"), True)   # a dir of the shim's
    with pytest.raises(w.TtrpcError) as e:
        svc._state_dir("c3", "relative", "/b/c3")
    assert e.value.code == w.INVALID_ARGUMENT
    containerd, _ = _service(tmp_path / "x", write_address_file=True)
    assert containerd._state_dir("c1", "", "/b/c1") == ("/b/c1", False)                # containerd: the bundle
