"""husk-cri's restart reconciliation (cri_server/recovery.py) without root: what a record becomes for each
state its shim reports, and how a shim's answer (or silence, or exit file) is read."""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from cri_server import recovery as rc
from cri_server.shims import ShimGone
from cri_server.store.records import ContainerRecord, ContainerState, SandboxRecord, SandboxState

NOW = 2_000_000_000_000_000_000
CREATED_AT = NOW - 60_000_000_000


def _container(state: ContainerState = ContainerState.CREATED, **kw: Any) -> ContainerRecord:
    return ContainerRecord(id="c1", sandbox_id="s1", name="n", container_name="c", attempt=0, state=state,
                           created_at=CREATED_AT, pid=41, shim_address="unix:///x/shim.sock",
                           extra={"shim_pid": 40, "runtime": "husk"}, **kw)


def _sandbox(state: SandboxState = SandboxState.READY) -> SandboxRecord:
    return SandboxRecord(id="s1", name="n", pod_name="p", pod_uid="u", pod_namespace="ns", attempt=0, state=state,
                         created_at=CREATED_AT, pid=30, shim_address="unix:///x/s.sock", extra={"shim_pid": 29})


# --- the decision ------------------------------------------------------------------------------------
def test_created_task_leaves_a_created_record_alone():
    rec = _container()
    assert rc.reconcile_container(rec, rc.TaskState(rc.CREATED, pid=41), NOW) is rec


def test_running_task_of_a_record_still_created_is_running_from_the_start_estimate():
    """husk-cri died between the shim's Start and recording it (issue 19)."""
    new = rc.reconcile_container(_container(), rc.TaskState(rc.RUNNING, pid=41), NOW, started_hint=NOW - 5)
    assert (new.state, new.started_at, new.pid, new.shim_address) == \
        (ContainerState.RUNNING, NOW - 5, 41, "unix:///x/shim.sock")
    # Without an estimate: the time of the restart, as containerd does.
    assert rc.reconcile_container(_container(), rc.TaskState(rc.RUNNING, pid=41), NOW).started_at == NOW


def test_running_task_keeps_a_recorded_start():
    rec = _container(ContainerState.RUNNING, started_at=CREATED_AT + 7)
    assert rc.reconcile_container(rec, rc.TaskState(rc.RUNNING, pid=41), NOW, started_hint=NOW - 5) == rec


@pytest.mark.parametrize("code,oom,reason", [(0, False, "Completed"), (3, False, "Error"), (137, True, "OOMKilled")])
def test_stopped_task_records_the_exit(code, oom, reason):
    rec = _container(ContainerState.RUNNING, started_at=CREATED_AT + 7)
    new = rc.reconcile_container(rec, rc.TaskState(rc.STOPPED, pid=41, exit_code=code, exited_at=NOW - 9, oom=oom),
                                 NOW)
    assert (new.state, new.exit_code, new.reason, new.finished_at, new.started_at) == \
        (ContainerState.EXITED, code, reason, NOW - 9, CREATED_AT + 7)
    assert new.shim_address == "" and "shim_pid" not in new.extra and new.extra["runtime"] == "husk"


def test_stopped_task_of_a_record_still_created_gets_the_start_estimate_not_after_the_exit():
    task = rc.TaskState(rc.STOPPED, exit_code=3, exited_at=NOW - 9)
    assert rc.reconcile_container(_container(), task, NOW, started_hint=NOW - 20).started_at == NOW - 20
    assert rc.reconcile_container(_container(), task, NOW, started_hint=NOW - 1).started_at == NOW - 9
    # Never started (the init died before Start): no start time.
    assert rc.reconcile_container(_container(), task, NOW).started_at == 0


def test_stopped_task_without_an_exit_time_uses_now():
    new = rc.reconcile_container(_container(ContainerState.RUNNING), rc.TaskState(rc.STOPPED, exit_code=1), NOW)
    assert new.finished_at == NOW


@pytest.mark.parametrize("state", [ContainerState.CREATED, ContainerState.RUNNING])
def test_gone_shim_is_an_unknown_exit(state):
    new = rc.reconcile_container(_container(state), rc.TaskState(rc.GONE, detail="connection refused"), NOW)
    assert (new.state, new.exit_code, new.reason, new.finished_at, new.shim_address) == \
        (ContainerState.EXITED, 255, "Unknown", NOW, "")
    assert "connection refused" in new.message


def test_no_answer_changes_nothing():
    rec = _container(ContainerState.RUNNING, started_at=5)
    assert rc.reconcile_container(rec, rc.TaskState(rc.UNKNOWN, detail="no answer in 10s"), NOW) is rec


def test_exited_records_are_not_touched():
    rec = _container(ContainerState.EXITED, finished_at=5, exit_code=1)
    assert rc.reconcile_container(rec, rc.TaskState(rc.RUNNING, pid=41), NOW) is rec


@pytest.mark.parametrize("status", [rc.CREATED, rc.RUNNING, rc.UNKNOWN])
def test_live_pause_task_keeps_the_sandbox_ready(status):
    rec = _sandbox()
    assert rc.reconcile_sandbox(rec, rc.TaskState(status, pid=30), NOW) is rec


def test_stopped_or_gone_pause_task_makes_the_sandbox_notready():
    new = rc.reconcile_sandbox(_sandbox(), rc.TaskState(rc.STOPPED, exit_code=0, exited_at=NOW - 3), NOW)
    assert (new.state, new.shim_address, new.extra["exit"]["code"], new.extra["exit"]["at"]) == \
        (SandboxState.NOTREADY, "", 0, NOW - 3)
    assert "shim_pid" not in new.extra
    gone = rc.reconcile_sandbox(_sandbox(), rc.TaskState(rc.GONE, detail="ENOENT"), NOW)
    assert (gone.state, gone.extra["exit"]["code"], gone.extra["exit"]["reason"]) == \
        (SandboxState.NOTREADY, 255, "Unknown")
    assert "ENOENT" in gone.extra["exit"]["message"]
    notready = _sandbox(SandboxState.NOTREADY)
    assert rc.reconcile_sandbox(notready, rc.TaskState(rc.GONE), NOW) is notready


_PENDING = {"exit_pending": {"code": 137, "at": NOW - 11, "oom": True, "message": ""}}


def test_gone_task_with_a_pending_exit_records_that_exit():
    """husk-cri was killed between the watcher's Delete (task and exit file gone) and recording the exit."""
    rec = _container(ContainerState.RUNNING, started_at=CREATED_AT + 7)
    rec = dataclasses.replace(rec, extra={**rec.extra, **_PENDING})
    new = rc.reconcile_container(rec, rc.TaskState(rc.GONE, detail="not found"), NOW)
    assert (new.state, new.exit_code, new.reason, new.finished_at, new.shim_address, new.message) == \
        (ContainerState.EXITED, 137, "OOMKilled", NOW - 11, "", "")
    assert "exit_pending" not in new.extra and "shim_pid" not in new.extra
    # The shim's own answer wins while it still has the task; the pending exit goes either way.
    stopped = rc.reconcile_container(rec, rc.TaskState(rc.STOPPED, exit_code=137, exited_at=NOW - 11), NOW)
    assert (stopped.exit_code, stopped.finished_at) == (137, NOW - 11) and "exit_pending" not in stopped.extra
    sb = dataclasses.replace(_sandbox(), extra={"shim_pid": 29, **_PENDING})
    gone = rc.reconcile_sandbox(sb, rc.TaskState(rc.GONE, detail="not found"), NOW)
    assert (gone.state, gone.shim_address, gone.extra["exit"]) == \
        (SandboxState.NOTREADY, "", {"code": 137, "at": NOW - 11, "reason": "OOMKilled", "message": ""})
    assert "exit_pending" not in gone.extra


# --- reading the shim ----------------------------------------------------------------------------------
@dataclasses.dataclass
class _Exit:
    pid: int
    exit_status: int
    exited_at_ns: int
    oom_killed: bool = False


class _Shims:
    def __init__(self, answer: Any, exit_rec: _Exit | None = None) -> None:
        self.answer = answer
        self.exit_rec = exit_rec

    async def call(self, object_id: str, address: str, method: str, timeout: float | None = 60.0, **kw: Any) -> Any:
        assert method == "State" and kw == {"id": object_id}
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def exit_record(self, object_id: str, exec_id: str = "") -> _Exit | None:
        return self.exit_rec


class _Svc:
    def __init__(self, shims: _Shims) -> None:
        self.shims = shims

    def need_shims(self) -> _Shims:
        return self.shims


def _query(answer: Any, exit_rec: _Exit | None = None) -> rc.TaskState:
    return asyncio.run(rc.query_task(_Svc(_Shims(answer, exit_rec)), "c1", "unix:///x"))  # type: ignore[arg-type]


def test_shim_states_are_read():
    from shim.pb import google, task as taskpb
    assert _query(taskpb.StateResponse(id="c1", pid=41, status=1)) == rc.TaskState(rc.CREATED, pid=41)
    assert _query(taskpb.StateResponse(id="c1", pid=41, status=2)) == rc.TaskState(rc.RUNNING, pid=41)
    assert _query(taskpb.StateResponse(id="c1", pid=41, status=4)).status == rc.RUNNING   # paused
    stopped = taskpb.StateResponse(id="c1", pid=41, status=3, exit_status=3,
                                   exited_at=google.Timestamp(seconds=5, nanos=7))
    assert _query(stopped, _Exit(41, 3, 5_000_000_007, True)) == \
        rc.TaskState(rc.STOPPED, pid=41, exit_code=3, exited_at=5_000_000_007, oom=True)


def test_gone_shim_is_read_from_its_exit_file_else_gone():
    assert _query(ShimGone("refused"), _Exit(41, 2, 9)) == rc.TaskState(rc.STOPPED, pid=41, exit_code=2, exited_at=9)
    assert _query(ShimGone("refused")) == rc.TaskState(rc.GONE, detail="refused")


def test_deleted_task_and_silent_shim():
    from shim import ttrpc_wire as w
    assert _query(w.TtrpcError(w.NOT_FOUND, "no task"), _Exit(41, 0, 9)).status == rc.STOPPED
    assert _query(w.TtrpcError(w.NOT_FOUND, "no task")).status == rc.GONE
    assert _query(w.TtrpcError(w.DEADLINE_EXCEEDED, "no answer in 10s")) == \
        rc.TaskState(rc.UNKNOWN, detail="no answer in 10s")


# --- StartContainer on a task the shim already started ---------------------------------------------------
class _StartedShims(_Shims):
    """A shim whose task runs (started by a Start whose husk-cri died): Start is refused, State says running."""

    def __init__(self, root: str) -> None:
        super().__init__(None)
        self.root = root
        self.calls: list[str] = []

    async def call(self, object_id: str, address: str, method: str, timeout: float | None = 60.0, **kw: Any) -> Any:
        from shim import ttrpc_wire as w
        from shim.pb import task as taskpb
        self.calls.append(method)
        if method == "Start":
            raise w.TtrpcError(w.FAILED_PRECONDITION, "container is running, not created")
        assert method == "State"
        return taskpb.StateResponse(id=object_id, pid=41, status=2)

    def root_for(self, runtime: str) -> str:
        return self.root


class _NoTasks:
    async def stop(self, object_id: str, sig: int, timeout: float) -> None:
        raise AssertionError("StartContainer must not stop a container that runs")


def test_start_of_a_running_task_records_it_and_refuses_without_killing(tmp_path):
    from types import SimpleNamespace

    from cri_server.api.v1 import api_pb2 as pb
    from cri_server.config import Config
    from cri_server.errors import FailedPrecondition
    from cri_server.rpc.container_lifecycle import start_container
    from cri_server.store.locks import KeyedLocks
    from cri_server.store.store import Store
    store = Store(str(tmp_path / "meta.db"))
    store.put_sandbox(_sandbox())
    store.put_container(_container())
    shims = _StartedShims(str(tmp_path / "runtime"))
    svc = SimpleNamespace(store=store, locks=KeyedLocks(), config=Config(), need_shims=lambda: shims,
                          need_tasks=lambda: _NoTasks())
    with pytest.raises(FailedPrecondition, match="c1 is running, not created"):
        asyncio.run(start_container(svc, pb.StartContainerRequest(container_id="c1")))  # type: ignore[arg-type]
    rec = store.get_container("c1")
    assert (rec.state, rec.pid, rec.shim_address) == (ContainerState.RUNNING, 41, "unix:///x/shim.sock")
    assert rec.started_at > 0 and shims.calls == ["Start", "State"]
    # Asked again, the record answers: no shim call.
    with pytest.raises(FailedPrecondition, match="running"):
        asyncio.run(start_container(svc, pb.StartContainerRequest(container_id="c1")))  # type: ignore[arg-type]
    assert shims.calls == ["Start", "State"]


# --- ending what stopped while husk-cri was away ------------------------------------------------------------
class _StoppedShims:
    """Every task reports stopped (exit 0)."""

    def __init__(self, root: str) -> None:
        self.root = root

    async def call(self, object_id: str, address: str, method: str, timeout: float | None = 60.0, **kw: Any) -> Any:
        from shim.pb import google, task as taskpb
        assert method == "State"
        return taskpb.StateResponse(id=object_id, pid=41, status=3, exit_status=0,
                                    exited_at=google.Timestamp(seconds=5))

    def exit_record(self, object_id: str, exec_id: str = "") -> None:
        return None

    def root_for(self, runtime: str) -> str:
        return self.root


def test_a_pods_ended_tasks_keep_its_shim_until_the_last(tmp_path, monkeypatch):
    """A pod whose sandbox and containers all stopped while husk-cri was down: each task was discarded with
    shared=False (the records had all been cleared), so the shim was asked to end while it still served the
    others, refused, and husk-cri waited 5 s for it per task before serving."""
    from cri_server.store.store import Store
    store = Store(str(tmp_path / "meta.db"))
    pod_shim = "unix:///x/s.sock"
    store.put_sandbox(dataclasses.replace(_sandbox(), shim_address=pod_shim))
    for cid in ("c1", "c2"):
        store.put_container(dataclasses.replace(_container(ContainerState.RUNNING), id=cid, name=f"n{cid}",
                                                shim_address=pod_shim))
    calls = []

    async def discard(svc: Any, oid: str, address: str, runtime: str, shim_pid: int = 0,
                      shared: bool | None = None) -> None:
        from cri_server.tasks import shim_shared
        calls.append((oid, address, bool(shared) or shim_shared(svc.store, address, oid)))

    monkeypatch.setattr(rc, "discard_task", discard)

    class Svc:
        def __init__(self) -> None:
            self.store = store
            self.shims = _StoppedShims(str(tmp_path))

        def need_shims(self) -> _StoppedShims:
            return self.shims
    try:
        asyncio.run(rc._reconcile_all(Svc()))  # type: ignore[arg-type]
    finally:
        store.close()
    assert sorted(oid for oid, _, _ in calls) == ["c1", "c2", "s1"]
    assert [shared for _, _, shared in calls] == [True, True, False]   # the shim ends with the last task only


def test_a_pending_exit_of_a_task_still_running_is_dropped():
    """A Wait that failed for another reason left a pending exit; the task answers running at restart: the
    stale exit must not be reported if the shim is lost later."""
    rec = _container(ContainerState.RUNNING, started_at=CREATED_AT + 7)
    rec = dataclasses.replace(rec, extra={**rec.extra, **_PENDING})
    new = rc.reconcile_container(rec, rc.TaskState(rc.RUNNING, pid=4321), NOW)
    assert new.state == ContainerState.RUNNING and "exit_pending" not in new.extra
    sb = dataclasses.replace(_sandbox(), extra={"shim_pid": 29, **_PENDING})
    kept = rc.reconcile_sandbox(sb, rc.TaskState(rc.RUNNING, pid=99), NOW)
    assert kept.state == SandboxState.READY and "exit_pending" not in kept.extra and kept.extra["shim_pid"] == 29
