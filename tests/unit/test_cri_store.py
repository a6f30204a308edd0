"""The metadata store: persistence, transactions, the index and its filters, names, locks."""
from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace

import pytest

from cri_server.errors import AlreadyExists, InvalidArgument, NotFound
from cri_server.store.locks import KeyedLocks
from cri_server.store.records import (ContainerFilter, ContainerRecord, ContainerState, SandboxFilter,
                                      SandboxRecord, SandboxState)
from cri_server.store.store import Store, sandbox_name


def sandbox(i: str, **kw) -> SandboxRecord:
    base = dict(id=i * 8, name=sandbox_name(f"pod{i}", "ns", f"uid{i}", 0), pod_name=f"pod{i}", pod_uid=f"uid{i}",
                pod_namespace="ns", attempt=0, state=SandboxState.READY, created_at=1, labels={"app": i},
                annotations={"a": "b"}, config=b"\x0a\x00", ips=("10.0.0.1", "fd00::1"), netns_path="/run/x")
    base.update(kw)
    return SandboxRecord(**base)


def container(i: str, sb: str, **kw) -> ContainerRecord:
    base = dict(id=i * 8, sandbox_id=sb, name=f"c{i}_{sb}", container_name=f"c{i}", attempt=0,
                state=ContainerState.RUNNING, created_at=2, labels={"c": i})
    base.update(kw)
    return ContainerRecord(**base)


@pytest.fixture
def store(tmp_path):
    s = Store(str(tmp_path / "meta.db"))
    yield s
    s.close()


def test_records_survive_reopen(tmp_path):
    path = str(tmp_path / "meta.db")
    s = Store(path)
    s.put_sandbox(sandbox("a", extra={"k": [1, 2]}))
    s.put_container(container("x", "aaaaaaaa", exit_code=137, reason="OOMKilled", state=ContainerState.EXITED))
    s.set_meta("pod_cidr", "10.1.0.0/16")
    s.close()
    s2 = Store(path)
    assert s2.get_sandbox("aaaaaaaa") == sandbox("a", extra={"k": [1, 2]})
    c = s2.get_container("xxxxxxxx")
    assert (c.exit_code, c.reason, c.state) == (137, "OOMKilled", ContainerState.EXITED)
    assert s2.get_meta("pod_cidr") == "10.1.0.0/16"
    s2.close()


def test_wal_and_full_sync(tmp_path, store):
    db = sqlite3.connect(store.path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_transaction_is_all_or_nothing(store):
    store.put_sandbox(sandbox("a"))
    with pytest.raises(RuntimeError):
        with store.transaction() as tx:
            tx.put_container(container("x", "aaaaaaaa"))
            tx.put_sandbox(replace(sandbox("a"), state=SandboxState.NOTREADY))
            raise RuntimeError("step 3 failed")
    assert store.get_sandbox("aaaaaaaa").state == SandboxState.READY
    assert store.find_container("xxxxxxxx") is None
    assert store._db.execute("SELECT COUNT(*) FROM containers").fetchone()[0] == 0


def test_container_needs_its_sandbox(store):
    with pytest.raises(NotFound):
        store.put_container(container("x", "nosuchsb"))


def test_sandbox_and_container_in_one_transaction(store):
    with store.transaction() as tx:
        tx.put_sandbox(sandbox("a"))
        tx.put_container(container("x", "aaaaaaaa"))
    assert [c.id for c in store.containers_of("aaaaaaaa")] == ["xxxxxxxx"]


def test_delete_sandbox_removes_its_containers(store):
    store.put_sandbox(sandbox("a"))
    store.put_sandbox(sandbox("b"))
    store.put_container(container("x", "aaaaaaaa"))
    store.put_container(container("y", "bbbbbbbb"))
    store.delete_sandbox("aaaaaaaa")
    assert store.find_sandbox("aaaaaaaa") is None
    assert store.find_container("xxxxxxxx") is None
    assert store.get_container("yyyyyyyy").sandbox_id == "bbbbbbbb"
    assert store._db.execute("SELECT COUNT(*) FROM containers").fetchone()[0] == 1
    # The names are free again.
    store.reserve_sandbox_name(sandbox("a").name, "other")


def test_prefix_lookup(store):
    store.put_sandbox(sandbox("a", id="abc123"))
    store.put_sandbox(sandbox("b", id="abd456"))
    assert store.get_sandbox("abc").id == "abc123"
    with pytest.raises(InvalidArgument, match="ambiguous"):
        store.get_sandbox("ab")
    with pytest.raises(NotFound):
        store.get_sandbox("zzz")
    with pytest.raises(InvalidArgument):
        store.get_sandbox("")


def test_sandbox_filters(store):
    store.put_sandbox(sandbox("a", labels={"app": "web", "tier": "1"}))
    store.put_sandbox(sandbox("b", labels={"app": "web"}, state=SandboxState.NOTREADY))
    store.put_sandbox(sandbox("c", labels={"app": "db"}))

    def ids(**kw):
        return sorted(r.id[0] for r in store.list_sandboxes(SandboxFilter(**kw)))
    assert ids() == ["a", "b", "c"]
    assert ids(state=SandboxState.READY) == ["a", "c"]
    assert ids(label_selector={"app": "web"}) == ["a", "b"]
    assert ids(label_selector={"app": "web", "tier": "1"}) == ["a"]
    assert ids(label_selector={"app": "web"}, state=SandboxState.NOTREADY) == ["b"]
    assert ids(id="aaaa") == ["a"]
    assert ids(id="aaaa", state=SandboxState.NOTREADY) == []
    assert ids(id="nope") == []


def test_container_filters(store):
    store.put_sandbox(sandbox("a"))
    store.put_sandbox(sandbox("b"))
    store.put_container(container("x", "aaaaaaaa", labels={"k": "1"}))
    store.put_container(container("y", "aaaaaaaa", state=ContainerState.EXITED))
    store.put_container(container("z", "bbbbbbbb", labels={"k": "1"}))

    def ids(**kw):
        return sorted(r.id[0] for r in store.list_containers(ContainerFilter(**kw)))
    assert ids() == ["x", "y", "z"]
    assert ids(sandbox_id="aaaaaaaa") == ["x", "y"]
    assert ids(sandbox_id="aaa") == ["x", "y"]            # a sandbox id prefix works too
    assert ids(state=ContainerState.RUNNING) == ["x", "z"]
    assert ids(label_selector={"k": "1"}) == ["x", "z"]
    assert ids(label_selector={"k": "1"}, sandbox_id="bbbbbbbb") == ["z"]
    assert ids(id="yyyy", state=ContainerState.RUNNING) == []
    assert ids(id="yyyy", sandbox_id="bbbbbbbb") == []
    assert ids(sandbox_id="nosuch") == []


def test_name_reservation(store):
    store.reserve_sandbox_name("pod_ns_uid_0", "id1")
    with pytest.raises(AlreadyExists) as e:
        store.reserve_sandbox_name("pod_ns_uid_0", "id2")
    assert e.value.existing_id == "id1" and "id1" in str(e.value)
    store.reserve_sandbox_name("pod_ns_uid_0", "id1")      # the holder may re-reserve
    store.release_sandbox_name("pod_ns_uid_0", "id2")      # not the holder: no effect
    with pytest.raises(AlreadyExists):
        store.reserve_sandbox_name("pod_ns_uid_0", "id2")
    store.release_sandbox_name("pod_ns_uid_0", "id1")
    store.reserve_sandbox_name("pod_ns_uid_0", "id2")


def test_stored_names_are_reserved_after_restart(tmp_path):
    path = str(tmp_path / "m.db")
    s = Store(path)
    s.put_sandbox(sandbox("a"))
    s.put_container(container("x", "aaaaaaaa"))
    s.close()
    s = Store(path)
    with pytest.raises(AlreadyExists) as e:
        s.reserve_sandbox_name(sandbox("a").name, "new")
    assert e.value.existing_id == "aaaaaaaa"
    with pytest.raises(AlreadyExists):
        s.reserve_container_name("cx_aaaaaaaa", "new")
    # Releasing the name of a stored record is refused: only failed creates release.
    s.release_container_name("cx_aaaaaaaa", "xxxxxxxx")
    with pytest.raises(AlreadyExists):
        s.reserve_container_name("cx_aaaaaaaa", "new")
    s.close()


def test_newer_schema_is_refused(tmp_path):
    path = str(tmp_path / "m.db")
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(RuntimeError, match="newer"):
        Store(path)


def test_keyed_locks_serialise_one_key_and_not_others():
    locks = KeyedLocks()
    order: list[str] = []

    async def work(key: str, tag: str, started: asyncio.Event | None, release: asyncio.Event) -> None:
        async with locks.hold(key):
            order.append(f"{tag}-in")
            if started:
                started.set()
            await release.wait()
            order.append(f"{tag}-out")

    async def main() -> None:
        rel_a, rel_b, rel_c = asyncio.Event(), asyncio.Event(), asyncio.Event()
        a_in = asyncio.Event()
        ta = asyncio.create_task(work("pod1", "a", a_in, rel_a))
        await a_in.wait()
        tb = asyncio.create_task(work("pod1", "b", None, rel_b))
        c_in = asyncio.Event()
        tc = asyncio.create_task(work("pod2", "c", c_in, rel_c))
        await c_in.wait()                       # pod2 is not blocked by pod1
        assert order == ["a-in", "c-in"]
        assert locks.is_held("pod1")
        rel_b.set()
        rel_c.set()
        await tc
        assert "b-in" not in order              # b still waits for a
        rel_a.set()
        await asyncio.gather(ta, tb)
        assert order.index("a-out") < order.index("b-in")
        assert len(locks) == 0                  # no lock outlives its users

    asyncio.run(main())
