"""cri_server/store/sqlitedb.py: the one SQLite helper of the metadata store and the image database."""
from __future__ import annotations

import os
import sqlite3

import pytest

from cri_server.images import metadata
from cri_server.images.metadata import MetadataDB
from cri_server.store import sqlitedb
from cri_server.store.records import SandboxRecord, SandboxState
from cri_server.store.store import Store, records_from_connection

SCHEMA = "CREATE TABLE IF NOT EXISTS t(k TEXT PRIMARY KEY, v TEXT NOT NULL);"


def test_open_db_sets_wal_busy_timeout_and_version(tmp_path):
    path = str(tmp_path / "x.db")
    conn = sqlitedb.open_db(path, SCHEMA, 3)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == int(sqlitedb.BUSY_TIMEOUT * 1000)
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2        # FULL
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    conn.close()
    # Opening again keeps what is there.
    conn = sqlitedb.open_db(path, SCHEMA, 3)
    assert sqlitedb.schema_version(conn) == 3
    conn.close()


def test_newer_version_is_refused_naming_the_file(tmp_path):
    path = str(tmp_path / "x.db")
    sqlitedb.open_db(path, SCHEMA, 5).close()
    with pytest.raises(sqlitedb.SchemaTooNew, match=r"x\.db: schema version 5 is newer .*\(2\)"):
        sqlitedb.open_db(path, SCHEMA, 2)


def test_image_database_made_by_the_old_code_opens_and_keeps_its_rows(tmp_path):
    # What MetadataDB wrote before sqlitedb: its schema, the version as meta('schema', '1'), user_version 0.
    path = str(tmp_path / "meta.db")
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("PRAGMA journal_mode=WAL")
    old.executescript("BEGIN IMMEDIATE;" + metadata._SCHEMA +
                      "INSERT OR IGNORE INTO meta(key, value) VALUES('schema', '1');COMMIT;")
    old.execute("INSERT INTO images VALUES('sha256:c', 'sha256:m', 'mt', x'7b7d', '[]', '[]', 5, 1, 1.5)")
    old.execute("INSERT INTO names VALUES('docker.io/library/busybox:latest', 'sha256:c', 'sha256:m')")
    assert old.execute("PRAGMA user_version").fetchone()[0] == 0
    old.close()
    db = MetadataDB(path)
    assert [i.id for i in db.images()] == ["sha256:c"] and db.images()[0].pinned
    assert [n.name for n in db.names()] == ["docker.io/library/busybox:latest"]
    assert db.conn.execute("PRAGMA user_version").fetchone()[0] == metadata.SCHEMA_VERSION
    db.close()


def test_a_newer_legacy_image_version_is_refused(tmp_path):
    path = str(tmp_path / "meta.db")
    old = sqlite3.connect(path, isolation_level=None)
    old.executescript(metadata._SCHEMA + "INSERT INTO meta(key, value) VALUES('schema', '9');")
    old.close()
    with pytest.raises(sqlitedb.SchemaTooNew, match="version 9"):
        MetadataDB(path)


def test_store_database_made_by_the_old_code_opens(tmp_path):
    # What Store wrote before sqlitedb: executescript(_SCHEMA) then PRAGMA user_version = 1.
    from cri_server.store import store as st
    path = str(tmp_path / "metadata.db")
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("PRAGMA journal_mode=WAL")
    old.executescript(st._SCHEMA)
    old.execute("PRAGMA user_version = 1")
    old.execute("INSERT INTO sandboxes (id, name, pod_name, pod_uid, pod_namespace, attempt, state, created_at,"
                " runtime_handler, labels, annotations, config, netns_path, ips, pid, shim_address, cgroup_parent,"
                " pod_dir, extra) VALUES ('s1', 'n', 'p', 'u', 'ns', 0, 'ready', 7, '', '{}', '{}', x'',"
                " '', '[\"10.0.0.2\"]', 42, '', '', '', '{}')")
    old.close()
    s = Store(path)
    rec = s.get_sandbox("s1")
    assert rec.state == SandboxState.READY and rec.ips == ("10.0.0.2",) and rec.pid == 42
    s.close()


def test_transaction_commits_rolls_back_and_refuses_nesting_unless_joined(tmp_path):
    conn = sqlitedb.open_db(str(tmp_path / "x.db"), SCHEMA, 1)
    with sqlitedb.transaction(conn) as c:
        c.execute("INSERT INTO t VALUES('a', '1')")
    with pytest.raises(ZeroDivisionError):
        with sqlitedb.transaction(conn) as c:
            c.execute("INSERT INTO t VALUES('b', '2')")
            1 / 0
    assert not conn.in_transaction
    assert [r[0] for r in conn.execute("SELECT k FROM t")] == ["a"]
    with sqlitedb.transaction(conn) as c:
        with pytest.raises(sqlite3.OperationalError, match="already open"):
            with sqlitedb.transaction(conn):
                pass
        with sqlitedb.transaction(conn, join=True) as inner:
            inner.execute("INSERT INTO t VALUES('c', '3')")
        assert conn.in_transaction          # the joined block did not commit the outer one
    assert sorted(r[0] for r in conn.execute("SELECT k FROM t")) == ["a", "c"]
    conn.close()


def test_non_durable_transaction_restores_synchronous_full(tmp_path):
    conn = sqlitedb.open_db(str(tmp_path / "x.db"), SCHEMA, 1)
    with sqlitedb.transaction(conn, durable=False) as c:
        assert c.execute("PRAGMA synchronous").fetchone()[0] == 1      # NORMAL
        c.execute("INSERT INTO t VALUES('a', '1')")
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    conn.close()


def test_metadata_generation_counts_only_outermost_commits(tmp_path):
    db = MetadataDB(str(tmp_path / "meta.db"))
    with db.tx():
        with db.tx():
            pass
    assert db.local_generation == 1
    db.close()


def test_open_readonly_creates_nothing_and_reads_records(tmp_path):
    path = str(tmp_path / "metadata.db")
    s = Store(path)
    s.put_sandbox(SandboxRecord(id="s1", name="n", pod_name="p", pod_uid="u", pod_namespace="ns", attempt=0,
                                state=SandboxState.READY, created_at=1))
    s.close()
    for side in ("-wal", "-shm"):
        assert not os.path.exists(path + side)
    conn = sqlitedb.open_readonly(path)
    recs = records_from_connection(conn)
    conn.close()
    assert [r.id for r in recs.sandboxes] == ["s1"] and recs.containers == []
    assert sorted(os.listdir(tmp_path)) == ["metadata.db"]
    with pytest.raises(FileNotFoundError):
        sqlitedb.open_readonly(str(tmp_path / "none.db"))
    assert sorted(os.listdir(tmp_path)) == ["metadata.db"]


def test_a_table_missing_from_a_current_version_file_is_made(tmp_path):
    path = str(tmp_path / "x.db")
    sqlitedb.open_db(path, SCHEMA, 1).close()
    conn = sqlitedb.open_db(path, SCHEMA + "CREATE TABLE IF NOT EXISTS u(a INTEGER);", 1)
    assert conn.execute("SELECT count(*) FROM u").fetchone()[0] == 0
    conn.close()
