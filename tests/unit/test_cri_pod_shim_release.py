"""Who ends a pod's shim (cri_server/tasks.py, recovery.py) without root: a record names the shim while it has, or
is about to have, a task there (a container being created names it before its Create is sent); letting go of
it and asking whether another record still names it is one step, so of the sandbox's exit watcher and a
container create's undo, whichever lets go last ends the shim, and the other never asks a shim that still
serves a task to end (it refused, and husk-cri waited 5 s for it to go)."""
from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from cri_server import recovery as rc
from cri_server import tasks
from cri_server.store.records import ContainerRecord, ContainerState, SandboxRecord, SandboxState
from cri_server.store.store import Store

POD_SHIM = "unix:///run/x/shims/s1/shim.sock"


class _Shims:
    """A pod shim whose tasks are all gone already: Kill and Delete answer NotFound; shutdowns are recorded."""

    def __init__(self, base: str = "/nonexistent") -> None:
        self.base = base
        self.shutdowns: list[tuple[str, str, int, bool]] = []

    async def call(self, object_id: str, address: str, method: str, timeout: float | None = 60.0, **kw: Any) -> Any:
        from shim import ttrpc_wire as w
        assert method in ("Kill", "Delete"), method
        raise w.TtrpcError(w.NOT_FOUND, f"container {object_id!r}: task not created")

    async def shutdown(self, object_id: str, address: str, pid: int = 0, shared: bool = False) -> None:
        self.shutdowns.append((object_id, address, pid, shared))

    def shim_dir(self, address: str) -> str:
        return ""


def _sandbox(state: SandboxState = SandboxState.READY, address: str = POD_SHIM) -> SandboxRecord:
    return SandboxRecord(id="s1", name="n", pod_name="p", pod_uid="u", pod_namespace="ns", attempt=0, state=state,
                         created_at=1, pid=30, shim_address=address, extra={"shim_pid": 29})


def _creating(address: str = POD_SHIM) -> ContainerRecord:
    return ContainerRecord(id="c1", sandbox_id="s1", name="c1n", container_name="c", attempt=0,
                           state=ContainerState.CREATED, created_at=2, shim_address=address,
                           extra={"creating": True, "runtime": "husk", "shim_pid": 29})


@pytest.fixture
def svc(tmp_path):
    store = Store(str(tmp_path / "meta.db"))
    shims = _Shims(str(tmp_path / "shims"))
    yield SimpleNamespace(store=store, shims=shims, need_shims=lambda: shims)
    store.close()


def _pause_exited(svc: Any) -> None:
    """The sandbox's exit watcher, from the task's exit on (records it, deletes the task, ends the shim)."""
    monitor = tasks.TaskMonitor(svc)
    asyncio.run(monitor._finish("s1", POD_SHIM, tasks.ExitInfo(137, 5)))


def _create_undone(svc: Any) -> None:
    """CreateContainer's undo after its Create failed in the shim."""
    asyncio.run(tasks.discard_task(svc, "c1", POD_SHIM, "", 29))


@pytest.mark.parametrize("order", [(_pause_exited, _create_undone), (_create_undone, _pause_exited)],
                         ids=["pause exit first", "create undo first"])
def test_the_last_to_let_go_of_a_pod_shim_ends_it(svc, order):
    svc.store.put_sandbox(_sandbox())
    svc.store.put_container(_creating())
    for step in order:
        step(svc)
    first, last = ("s1", "c1") if order[0] is _pause_exited else ("c1", "s1")
    assert [(oid, shared) for oid, _, _, shared in svc.shims.shutdowns] == [(first, True), (last, False)]
    s = svc.store.get_sandbox("s1")
    assert (s.state, s.shim_address, s.extra["exit"]["code"]) == (SandboxState.NOTREADY, "", 137)
    c = svc.store.get_container("c1")
    assert c.shim_address == "" and "shim_pid" not in c.extra and c.extra["creating"]


def test_a_creating_container_keeps_the_shim_from_the_sandbox_watcher(svc):
    """Before its Create is answered, the container's task may already be in the shim: the watcher leaves it."""
    svc.store.put_sandbox(_sandbox())
    svc.store.put_container(_creating())
    _pause_exited(svc)
    assert svc.shims.shutdowns == [("s1", POD_SHIM, 29, True)]


def test_release_of_a_shim_the_record_no_longer_names_does_nothing(svc):
    svc.store.put_sandbox(_sandbox(SandboxState.NOTREADY, address=""))
    svc.store.put_container(_creating())
    asyncio.run(tasks.discard_task(svc, "c1", POD_SHIM, "", 29))
    asyncio.run(tasks.release_shim(svc, "c1", POD_SHIM, 29))     # the undo's next step: already released
    assert svc.shims.shutdowns == [("c1", POD_SHIM, 29, False)]


def test_release_of_a_shim_no_task_was_made_in(svc):
    """CreateContainer failed before its Create (e.g. the pause exited while the rootfs was made)."""
    svc.store.put_sandbox(_sandbox(SandboxState.NOTREADY, address=""))
    svc.store.put_container(_creating())
    asyncio.run(tasks.release_shim(svc, "c1", POD_SHIM, 29))
    assert svc.shims.shutdowns == [("c1", POD_SHIM, 29, False)]
    assert svc.store.get_container("c1").shim_address == ""


def test_recovery_finds_a_creating_containers_task_in_the_shim_its_record_names(svc, tmp_path, monkeypatch):
    """husk-cri died during CreateContainer after the sandbox's exit was recorded (its record names no shim any
    more): the container's record still names the pod's shim, so its task is discarded there and the shim
    ended, instead of being left with a task no record names."""
    svc.store.put_sandbox(_sandbox(SandboxState.NOTREADY, address=""))
    svc.store.put_container(_creating())
    discarded = []

    async def discard(svc_: Any, object_id: str, runtime: str, pod_shim: str = "") -> None:
        discarded.append((object_id, pod_shim))

    async def remove_locked(svc_: Any, object_id: str) -> None:
        svc.store.delete_container(object_id)

    async def remove_sandbox_locked(svc_: Any, object_id: str) -> None:
        raise AssertionError("no sandbox was being created")

    from cri_server.store.locks import KeyedLocks
    monkeypatch.setattr(rc, "_discard_by_socket", discard)
    svc.locks = KeyedLocks()
    svc.need_tasks = lambda: SimpleNamespace(watch=lambda oid: None)
    (tmp_path / "shims").mkdir()
    asyncio.run(rc.recover(svc, remove_locked=remove_locked, remove_sandbox_locked=remove_sandbox_locked))
    assert discarded == [("c1", POD_SHIM)]
    assert svc.store.find_container("c1") is None


def test_stopping_a_sandbox_clears_its_shim_in_the_record(svc):
    svc.store.put_sandbox(_sandbox())
    asyncio.run(tasks.discard_task(svc, "s1", POD_SHIM, "", 29))
    s = svc.store.get_sandbox("s1")
    assert s.shim_address == "" and "shim_pid" not in s.extra
    assert svc.shims.shutdowns == [("s1", POD_SHIM, 29, False)]
    # A record naming another shim (from before shims were grouped) is left as it is.
    svc.store.put_container(dataclasses.replace(_creating("unix:///own.sock"), extra={"runtime": "husk"}))
    asyncio.run(tasks.discard_task(svc, "c1", POD_SHIM, "", 0))
    assert svc.store.get_container("c1").shim_address == "unix:///own.sock"
