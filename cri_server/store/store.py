"""The metadata store: sandbox and container records in one SQLite file, mirrored in memory.

Every change is one SQLite transaction; the in-memory index is updated only after the commit, so List* and
*Status (kubelet calls them every second) never touch the disk and never see a half-made change. Names are
reserved in memory before a create starts, so two creates of one name cannot race. Not thread-safe: use
it from the daemon's event loop only.

Durability: journal_mode=WAL with synchronous=FULL. A commit costs one fdatasync of the WAL. Changes are rare
(a few per pod start or stop), and a record that exists on a shim's side must not be lost to a power cut
after the RPC returned, which synchronous=NORMAL allows (it syncs only at checkpoints).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
from dataclasses import dataclass
from dataclasses import fields, replace
from typing import Any, Callable, Iterator

from cri_server.errors import AlreadyExists, InvalidArgument, NotFound
from cri_server.store import sqlitedb
from cri_server.store.records import (ContainerFilter, ContainerRecord, ContainerState, SandboxFilter,
                                      SandboxRecord, SandboxState)

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sandboxes (
    id              TEXT PRIMARY KEY,
    name            TEXT NOT NULL UNIQUE,
    pod_name        TEXT NOT NULL,
    pod_uid         TEXT NOT NULL,
    pod_namespace   TEXT NOT NULL,
    attempt         INTEGER NOT NULL,
    state           TEXT NOT NULL,
    created_at      INTEGER NOT NULL,
    runtime_handler TEXT NOT NULL,
    labels          TEXT NOT NULL,
    annotations     TEXT NOT NULL,
    config          BLOB NOT NULL,
    netns_path      TEXT NOT NULL,
    ips             TEXT NOT NULL,
    pid             INTEGER NOT NULL,
    shim_address    TEXT NOT NULL,
    cgroup_parent   TEXT NOT NULL,
    pod_dir         TEXT NOT NULL,
    extra           TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS containers (
    id             TEXT PRIMARY KEY,
    sandbox_id     TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
    name           TEXT NOT NULL UNIQUE,
    container_name TEXT NOT NULL,
    attempt        INTEGER NOT NULL,
    state          TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    started_at     INTEGER NOT NULL,
    finished_at    INTEGER NOT NULL,
    exit_code      INTEGER NOT NULL,
    reason         TEXT NOT NULL,
    message        TEXT NOT NULL,
    image          TEXT NOT NULL,
    image_ref      TEXT NOT NULL,
    image_id       TEXT NOT NULL,
    labels         TEXT NOT NULL,
    annotations    TEXT NOT NULL,
    config         BLOB NOT NULL,
    log_path       TEXT NOT NULL,
    pid            INTEGER NOT NULL,
    shim_address   TEXT NOT NULL,
    extra          TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS containers_by_sandbox ON containers(sandbox_id);
"""

_JSON_FIELDS = {"labels", "annotations", "ips", "extra"}
_SANDBOX_COLS = [f.name for f in fields(SandboxRecord)]
_CONTAINER_COLS = [f.name for f in fields(ContainerRecord)]


def _to_row(rec: Any, cols: list[str]) -> list[Any]:
    row = []
    for c in cols:
        v = getattr(rec, c)
        if c in _JSON_FIELDS:
            v = json.dumps(list(v) if c == "ips" else dict(v), sort_keys=True)
        elif c == "state":
            v = v.value
        row.append(v)
    return row


def _from_row(cls: type, cols: list[str], row: sqlite3.Row, state_type: type) -> Any:
    kw: dict[str, Any] = {}
    present = row.keys()
    for c in cols:
        if c not in present:
            continue    # a column an older or newer husk-cri's file does not have: the record's default
        v = row[c]
        if c in _JSON_FIELDS:
            v = json.loads(v)
            if c == "ips":
                v = tuple(v)
        elif c == "state":
            v = state_type(v)
        kw[c] = v
    return cls(**kw)


@dataclass(frozen=True)
class Records:
    """Every sandbox and container record of one read of the store's file."""
    sandboxes: list[SandboxRecord]
    containers: list[ContainerRecord]


def records_from_connection(conn: sqlite3.Connection) -> Records:
    """The records in the store's file behind `conn` (any connection whose row_factory is sqlite3.Row, e.g.
    a read-only one from `sqlitedb.open_readonly`). Call it inside one read transaction for a consistent view."""
    return Records(
        [_from_row(SandboxRecord, _SANDBOX_COLS, r, SandboxState) for r in conn.execute("SELECT * FROM sandboxes")],
        [_from_row(ContainerRecord, _CONTAINER_COLS, r, ContainerState)
         for r in conn.execute("SELECT * FROM containers")])


def sandbox_name(pod_name: str, pod_namespace: str, pod_uid: str, attempt: int) -> str:
    """The reservation key of a sandbox: unique per pod attempt, as kubelet and containerd build it."""
    return "_".join([pod_name, pod_namespace, pod_uid, str(attempt)])


def container_name(name: str, sandbox: SandboxRecord, attempt: int) -> str:
    return "_".join([name, sandbox.pod_name, sandbox.pod_namespace, sandbox.pod_uid, str(attempt)])


class Transaction:
    """Changes made in one SQLite transaction; the index sees them only after the commit."""

    def __init__(self, store: "Store", cur: sqlite3.Cursor) -> None:
        self._store = store
        self._cur = cur
        self._after: list[Callable[[], None]] = []

    def put_sandbox(self, rec: SandboxRecord) -> None:
        cols = _SANDBOX_COLS
        self._cur.execute(f"INSERT OR REPLACE INTO sandboxes ({','.join(cols)}) VALUES ({','.join('?' * len(cols))})",
                          _to_row(rec, cols))
        self._after.append(lambda: self._store._index_sandbox(rec))

    def put_container(self, rec: ContainerRecord) -> None:
        if rec.sandbox_id not in self._store._sandboxes and not self._pending_sandbox(rec.sandbox_id):
            raise NotFound(f"sandbox {rec.sandbox_id!r} of container {rec.id!r} does not exist")
        cols = _CONTAINER_COLS
        self._cur.execute(f"INSERT OR REPLACE INTO containers ({','.join(cols)}) VALUES ({','.join('?' * len(cols))})",
                          _to_row(rec, cols))
        self._after.append(lambda: self._store._index_container(rec))

    def delete_sandbox(self, sandbox_id: str) -> None:
        """Deletes the sandbox and every container record in it."""
        self._cur.execute("DELETE FROM containers WHERE sandbox_id = ?", (sandbox_id,))
        self._cur.execute("DELETE FROM sandboxes WHERE id = ?", (sandbox_id,))
        self._after.append(lambda: self._store._unindex_sandbox(sandbox_id))

    def delete_container(self, container_id: str) -> None:
        self._cur.execute("DELETE FROM containers WHERE id = ?", (container_id,))
        self._after.append(lambda: self._store._unindex_container(container_id))

    def _pending_sandbox(self, sandbox_id: str) -> bool:
        row = self._cur.execute("SELECT 1 FROM sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
        return row is not None


class Store:
    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        # Transactions are explicit (sqlitedb.transaction: BEGIN IMMEDIATE ... COMMIT).
        self._db = sqlitedb.open_db(path, _SCHEMA, SCHEMA_VERSION, row_factory=sqlite3.Row)
        self._sandboxes: dict[str, SandboxRecord] = {}
        self._containers: dict[str, ContainerRecord] = {}
        self._containers_by_sandbox: dict[str, set[str]] = {}
        self._sandbox_names: dict[str, str] = {}
        self._container_names: dict[str, str] = {}
        self._load()

    def close(self) -> None:
        self._db.close()

    def _load(self) -> None:
        recs = records_from_connection(self._db)
        for sb in recs.sandboxes:
            self._index_sandbox(sb)
        for ctr in recs.containers:
            self._index_container(ctr)
        log.info("metadata loaded", extra={"path": self.path, "sandboxes": len(self._sandboxes),
                                           "containers": len(self._containers)})

    # --- transactions ------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        with sqlitedb.transaction(self._db) as conn:
            tx = Transaction(self, conn.cursor())
            yield tx
        for apply in tx._after:
            apply()

    def put_sandbox(self, rec: SandboxRecord) -> None:
        with self.transaction() as tx:
            tx.put_sandbox(rec)

    def put_container(self, rec: ContainerRecord) -> None:
        with self.transaction() as tx:
            tx.put_container(rec)

    def delete_sandbox(self, sandbox_id: str) -> None:
        with self.transaction() as tx:
            tx.delete_sandbox(sandbox_id)

    def delete_container(self, container_id: str) -> None:
        with self.transaction() as tx:
            tx.delete_container(container_id)

    def set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def get_meta(self, key: str, default: str = "") -> str:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def meta_keys(self, prefix: str) -> list[str]:
        """The meta keys starting with `prefix`, sorted."""
        rows = self._db.execute("SELECT key FROM meta WHERE substr(key, 1, ?) = ? ORDER BY key",
                                (len(prefix), prefix))
        return [r[0] for r in rows]

    def delete_meta(self, key: str) -> None:
        self._db.execute("DELETE FROM meta WHERE key = ?", (key,))

    # --- the in-memory index -----------------------------------------------------------------
    def _index_sandbox(self, rec: SandboxRecord) -> None:
        old = self._sandboxes.get(rec.id)
        if old is not None and old.name != rec.name:
            self._sandbox_names.pop(old.name, None)
        self._sandboxes[rec.id] = rec
        self._sandbox_names[rec.name] = rec.id
        self._containers_by_sandbox.setdefault(rec.id, set())

    def _unindex_sandbox(self, sandbox_id: str) -> None:
        rec = self._sandboxes.pop(sandbox_id, None)
        if rec is not None and self._sandbox_names.get(rec.name) == sandbox_id:
            del self._sandbox_names[rec.name]
        for cid in self._containers_by_sandbox.pop(sandbox_id, set()):
            self._unindex_container(cid)

    def _index_container(self, rec: ContainerRecord) -> None:
        old = self._containers.get(rec.id)
        if old is not None and old.name != rec.name:
            self._container_names.pop(old.name, None)
        self._containers[rec.id] = rec
        self._container_names[rec.name] = rec.id
        self._containers_by_sandbox.setdefault(rec.sandbox_id, set()).add(rec.id)

    def _unindex_container(self, container_id: str) -> None:
        rec = self._containers.pop(container_id, None)
        if rec is None:
            return
        if self._container_names.get(rec.name) == container_id:
            del self._container_names[rec.name]
        ids = self._containers_by_sandbox.get(rec.sandbox_id)
        if ids is not None:
            ids.discard(container_id)

    # --- names ---------------------------------------------------------------------------------
    def reserve_sandbox_name(self, name: str, sandbox_id: str) -> None:
        """Claims `name` for a sandbox being created; AlreadyExists names the id that holds it."""
        holder = self._sandbox_names.get(name)
        if holder is not None and holder != sandbox_id:
            raise AlreadyExists(f"pod sandbox name {name!r} is reserved for {holder!r}", existing_id=holder)
        self._sandbox_names[name] = sandbox_id

    def release_sandbox_name(self, name: str, sandbox_id: str) -> None:
        """Frees a reservation that never became a record (a failed create)."""
        if self._sandbox_names.get(name) == sandbox_id and sandbox_id not in self._sandboxes:
            del self._sandbox_names[name]

    def reserve_container_name(self, name: str, container_id: str) -> None:
        holder = self._container_names.get(name)
        if holder is not None and holder != container_id:
            raise AlreadyExists(f"container name {name!r} is reserved for {holder!r}", existing_id=holder)
        self._container_names[name] = container_id

    def release_container_name(self, name: str, container_id: str) -> None:
        if self._container_names.get(name) == container_id and container_id not in self._containers:
            del self._container_names[name]

    # --- lookups -------------------------------------------------------------------------------
    @staticmethod
    def _resolve(table: dict[str, Any], id_or_prefix: str, kind: str) -> str | None:
        if not id_or_prefix:
            raise InvalidArgument(f"{kind} id must not be empty")
        if id_or_prefix in table:
            return id_or_prefix
        matches = [i for i in table if i.startswith(id_or_prefix)]
        if len(matches) > 1:
            raise InvalidArgument(f"{kind} id prefix {id_or_prefix!r} is ambiguous ({len(matches)} matches)")
        return matches[0] if matches else None

    def sandbox(self, sandbox_id: str) -> SandboxRecord | None:
        """The sandbox of exactly this id (no prefix matching), or None."""
        return self._sandboxes.get(sandbox_id)

    def container(self, container_id: str) -> ContainerRecord | None:
        """The container of exactly this id (no prefix matching), or None."""
        return self._containers.get(container_id)

    def record(self, object_id: str) -> ContainerRecord | SandboxRecord | None:
        """The container or, failing that, the sandbox of exactly this id (a task's owner), or None."""
        return self._containers.get(object_id) or self._sandboxes.get(object_id)

    def all_records(self) -> Iterator[SandboxRecord | ContainerRecord]:
        """Every sandbox, then every container record (creating ones too)."""
        yield from self._sandboxes.values()
        yield from self._containers.values()

    def find_sandbox(self, id_or_prefix: str) -> SandboxRecord | None:
        sid = self._resolve(self._sandboxes, id_or_prefix, "pod sandbox")
        return self._sandboxes[sid] if sid else None

    def get_sandbox(self, id_or_prefix: str) -> SandboxRecord:
        rec = self.find_sandbox(id_or_prefix)
        if rec is None:
            raise NotFound(f"pod sandbox {id_or_prefix!r} not found")
        return rec

    def find_container(self, id_or_prefix: str) -> ContainerRecord | None:
        cid = self._resolve(self._containers, id_or_prefix, "container")
        return self._containers[cid] if cid else None

    def get_container(self, id_or_prefix: str) -> ContainerRecord:
        rec = self.find_container(id_or_prefix)
        if rec is None:
            raise NotFound(f"container {id_or_prefix!r} not found")
        return rec

    def containers_of(self, sandbox_id: str) -> list[ContainerRecord]:
        return [self._containers[c] for c in self._containers_by_sandbox.get(sandbox_id, ())]

    def list_sandboxes(self, flt: SandboxFilter | None = None) -> list[SandboxRecord]:
        flt = flt or SandboxFilter()
        if flt.id:
            try:
                rec = self.find_sandbox(flt.id)
            except InvalidArgument:
                return []
            candidates = [rec] if rec else []
        else:
            candidates = list(self._sandboxes.values())
        if flt.state is None and not flt.label_selector:
            return candidates
        return [r for r in candidates if flt.matches(r)]

    def list_containers(self, flt: ContainerFilter | None = None) -> list[ContainerRecord]:
        flt = flt or ContainerFilter()
        if flt.sandbox_id:
            # The sandbox filter may be a prefix too; resolve it once.
            try:
                sb = self.find_sandbox(flt.sandbox_id)
            except InvalidArgument:
                return []
            if sb is None:
                return []
            flt = replace(flt, sandbox_id=sb.id)
        if flt.id:
            try:
                rec = self.find_container(flt.id)
            except InvalidArgument:
                return []
            candidates = [rec] if rec else []
        elif flt.sandbox_id:
            candidates = self.containers_of(flt.sandbox_id)
        else:
            candidates = list(self._containers.values())
        if flt.state is None and not flt.sandbox_id and not flt.label_selector:
            return candidates
        return [r for r in candidates if flt.matches(r)]
