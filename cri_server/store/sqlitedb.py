"""husk-cri's one way to open and write an SQLite file: the metadata store and the image database use it.

`open_db` connects with WAL, synchronous=FULL, foreign keys and one busy timeout, creates the schema and
records its version in `PRAGMA user_version` (the one version scheme), all in one write transaction, so two
processes opening a new file at once cannot both create it. `transaction` is the write transaction
(BEGIN IMMEDIATE: one writer at a time across processes). `open_readonly` is a reader that never writes
and never creates a file. Connections are made with check_same_thread=False: the callers use each one
from one thread at a time (the daemon's event loop, or an executor thread the loop waits for).
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
import urllib.parse
from collections.abc import Iterator

# How long a writer waits for another process's write transaction (the image CLI may hold one during a
# pull) before SQLite gives up with "database is locked". A WAL reader never waits on a writer.
BUSY_TIMEOUT = 30.0
# The legacy version record of image databases made before user_version was used: meta('schema', '1').
_LEGACY_META_KEY = "schema"


class SchemaTooNew(RuntimeError):
    """The file was written by a newer husk-cri whose schema this one does not know."""


def open_db(path: str, schema: str, version: int, *, busy_timeout: float = BUSY_TIMEOUT,
            row_factory: type | None = None) -> sqlite3.Connection:
    """A read-write connection to `path` with `schema` (CREATE ... IF NOT EXISTS statements) in place.

    The schema's version is `PRAGMA user_version`. A file of version 0 is either new or made before the
    version was recorded there (the image database kept it in its meta table); either way the idempotent
    schema is applied and the version set. A newer version than `version` is refused (SchemaTooNew).
    """
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    try:
        if row_factory is not None:
            conn.row_factory = row_factory
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        found = schema_version(conn)
        if found > version:
            raise SchemaTooNew(f"{path}: schema version {found} is newer than this husk-cri's ({version})")
        # One script, one transaction: idempotent (a table missing from an old file is made), and safe when two
        # processes open a new file at once. The version is written only when it changes.
        stamp = f"PRAGMA user_version = {int(version)};" \
            if int(conn.execute("PRAGMA user_version").fetchone()[0]) < version else ""
        conn.executescript(f"BEGIN IMMEDIATE;\n{schema}\n{stamp}\nCOMMIT;")
    except BaseException:
        conn.close()
        raise
    return conn


def schema_version(conn: sqlite3.Connection) -> int:
    """The file's schema version: user_version, else the legacy meta('schema') row, else 0 (a new file)."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version:
        return version
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (_LEGACY_META_KEY,)).fetchone()
    except sqlite3.OperationalError:      # no meta table: a new file, or a store that never had one
        return 0
    try:
        return int(row[0]) if row else 0
    except ValueError:
        return 0


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection, *, durable: bool = True, join: bool = False) -> Iterator[sqlite3.Connection]:
    """A write transaction: BEGIN IMMEDIATE, COMMIT at the end of the block, ROLLBACK when it raises.

    join=True lets a block inside an open transaction become part of it (it then neither commits nor rolls
    back); without it a nested block is an error, as SQLite makes it. durable=False skips the fsync of this
    commit (the WAL stays consistent; a crash may undo it): for bookkeeping that is cheap to redo.
    """
    if conn.in_transaction:
        if join:
            yield conn
            return
        raise sqlite3.OperationalError("a write transaction is already open on this connection")
    if not durable:
        conn.execute("PRAGMA synchronous=NORMAL")
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:        # SQLite already rolled back after some errors (SQLITE_FULL):
                conn.execute("ROLLBACK")   # a second ROLLBACK would hide the first error
            raise
        conn.execute("COMMIT")
    finally:
        if not durable:
            conn.execute("PRAGMA synchronous=FULL")


def in_use(path: str) -> bool:
    """A writer has the database open: its WAL side files exist."""
    return os.path.exists(path + "-wal") and os.path.exists(path + "-shm")


def open_readonly(path: str, *, busy_timeout: float = 2.0,
                  row_factory: type | None = sqlite3.Row) -> sqlite3.Connection:
    """A read-only connection that never writes and never creates a file (not even `-wal`/`-shm`).

    While a writer has the file open (its `-wal` and `-shm` exist) this is an ordinary WAL reader
    (`mode=ro`): it sees the last committed state and blocks no writer. When they are absent (the writer
    stopped cleanly, the WAL checkpointed into the file) SQLite would create them even for `mode=ro`, so the
    file is opened `immutable` instead (no locks, no side files). FileNotFoundError when there is no file.
    Close it as soon as the rows are read: an open read transaction keeps checkpoints from going past it.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    uri = f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro" + ("" if in_use(path) else "&immutable=1")
    conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    try:
        if row_factory is not None:
            conn.row_factory = row_factory
        conn.execute("PRAGMA query_only=ON")
    except BaseException:
        conn.close()
        raise
    return conn
