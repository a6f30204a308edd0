"""The exit watcher's order (cri_server/tasks.py) without root: the exit is committed to the record (pending)
before the task's Delete removes the shim's copy, and a watcher started again after husk-cri was killed past
that Delete records the pending exit, not 255 Unknown."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from cri_server import tasks
from cri_server.store.records import ContainerRecord, ContainerState, SandboxRecord, SandboxState
from cri_server.store.store import Store

POD_SHIM = "unix:///run/x/shims/s1/shim.sock"


class _Shims:
    """A pod shim whose task `c1` exited: Wait answers NotFound when `deleted`, Delete checks what the store
    holds at that moment."""

    def __init__(self, store_path: str, deleted: bool) -> None:
        self.store_path = store_path
        self.deleted = deleted
        self.seen_at_delete: Any = None

    async def call(self, object_id: str, address: str, method: str, timeout: float | None = 60.0, **kw: Any) -> Any:
        from shim import ttrpc_wire as w
        if method == "Delete":
            # What a husk-cri killed now would find: the committed rows, read through a second connection.
            other = Store(self.store_path)
            try:
                self.seen_at_delete = other.record(object_id)
            finally:
                other.close()
        if self.deleted or method == "Delete":
            raise w.TtrpcError(w.NOT_FOUND, f"container {object_id!r}: task not found")
        raise AssertionError(method)

    async def shutdown(self, object_id: str, address: str, pid: int = 0, shared: bool = False) -> None:
        pass

    def exit_record(self, object_id: str, exec_id: str = "") -> Any:
        return None


@pytest.fixture
def store(tmp_path):
    s = Store(str(tmp_path / "meta.db"))
    s.put_sandbox(SandboxRecord(id="s1", name="n", pod_name="p", pod_uid="u", pod_namespace="ns", attempt=0,
                                state=SandboxState.READY, created_at=1, pid=30, shim_address=POD_SHIM,
                                extra={"shim_pid": 29}))
    yield s
    s.close()


def _container(**extra: Any) -> ContainerRecord:
    return ContainerRecord(id="c1", sandbox_id="s1", name="c1n", container_name="c", attempt=0,
                           state=ContainerState.RUNNING, created_at=2, started_at=3, shim_address=POD_SHIM,
                           extra={"runtime": "", "shim_pid": 29, **extra})


def _svc(store: Store, tmp_path: Any, deleted: bool) -> Any:
    shims = _Shims(str(tmp_path / "meta.db"), deleted)
    return SimpleNamespace(store=store, shims=shims, need_shims=lambda: shims)


def test_the_exit_is_committed_before_the_delete(store, tmp_path):
    store.put_container(_container())
    svc = _svc(store, tmp_path, deleted=False)
    asyncio.run(tasks.TaskMonitor(svc)._finish("c1", POD_SHIM, tasks.ExitInfo(3, 77)))
    seen = svc.shims.seen_at_delete
    assert seen.state == ContainerState.RUNNING and tasks.pending_exit(seen) == tasks.ExitInfo(3, 77)
    c = store.container("c1")
    assert (c.state, c.exit_code, c.finished_at, c.reason, c.shim_address) == \
        (ContainerState.EXITED, 3, 77, "Error", "")
    assert tasks.PENDING_EXIT not in c.extra


def test_a_watcher_started_after_the_delete_records_the_pending_exit(store, tmp_path):
    store.put_container(_container(exit_pending={"code": 137, "at": 88, "oom": False, "message": ""}))
    svc = _svc(store, tmp_path, deleted=True)
    asyncio.run(tasks.TaskMonitor(svc)._watch("c1"))
    c = store.container("c1")
    assert (c.state, c.exit_code, c.finished_at, c.reason, c.message) == (ContainerState.EXITED, 137, 88, "Error", "")


def test_an_exit_that_cannot_be_kept_pending_is_still_recorded(store, tmp_path, monkeypatch):
    """The pending write is a safeguard: a store that refuses it (full disk) must not stop the watcher."""
    import sqlite3
    store.put_container(_container())
    svc = _svc(store, tmp_path, deleted=False)
    real = store.put_container

    def refuse_pending(rec: ContainerRecord) -> None:
        if tasks.PENDING_EXIT in rec.extra:
            raise sqlite3.OperationalError("database or disk is full")
        real(rec)
    monkeypatch.setattr(store, "put_container", refuse_pending)
    asyncio.run(tasks.TaskMonitor(svc)._finish("c1", POD_SHIM, tasks.ExitInfo(3, 77)))
    assert svc.shims.seen_at_delete is not None          # the Delete was sent
    c = store.container("c1")
    assert (c.state, c.exit_code, c.finished_at) == (ContainerState.EXITED, 3, 77)
