"""The image subsystem's SQLite file (WAL): image records, names, unpacked layers and active snapshots.

Each multi-step change is one transaction; the daemon and the operator CLI open the same file. Rows only: files
on disk belong to content.py and snapshots.py.
"""
from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass

from cri_server.store import sqlitedb

SCHEMA_VERSION = 1      # PRAGMA user_version (files made before it was used say meta('schema', '1'))

_SCHEMA = """
CREATE TABLE IF NOT EXISTS images(
    id TEXT PRIMARY KEY,                 -- the config digest
    manifest_digest TEXT NOT NULL,
    manifest_media_type TEXT NOT NULL,
    config BLOB NOT NULL,                -- the config JSON as fetched
    layers TEXT NOT NULL,                -- JSON [{digest, mediaType, size, diffID, chainID}]
    blobs TEXT NOT NULL,                 -- JSON [digest]: every content-store blob this image keeps alive
    size INTEGER NOT NULL,
    pinned INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS names(
    name TEXT PRIMARY KEY,               -- normalised repo:tag or repo@digest
    image_id TEXT NOT NULL REFERENCES images(id) ON DELETE CASCADE,
    target_digest TEXT NOT NULL          -- what the name resolved to (an index or a manifest)
);
CREATE INDEX IF NOT EXISTS names_image ON names(image_id);
CREATE TABLE IF NOT EXISTS layers(
    id INTEGER PRIMARY KEY AUTOINCREMENT, -- the directory name under snapshots/layers
    chain_id TEXT UNIQUE NOT NULL,
    parent TEXT NOT NULL DEFAULT '',
    diff_id TEXT NOT NULL,
    state TEXT NOT NULL,                 -- 'unpacking' | 'ready'
    bytes INTEGER NOT NULL DEFAULT 0,
    inodes INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS active(
    id INTEGER PRIMARY KEY AUTOINCREMENT, -- the directory name under snapshots/active
    key TEXT UNIQUE NOT NULL,
    image_id TEXT NOT NULL DEFAULT '',
    chain TEXT NOT NULL,                 -- JSON [chain id], bottom layer first
    mode TEXT NOT NULL,                  -- 'overlay' | 'copy'
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True)
class ImageRow:
    id: str
    manifest_digest: str
    manifest_media_type: str
    config: bytes
    layers: list[dict[str, object]]
    blobs: list[str]
    size: int
    pinned: bool
    created: float


@dataclass(frozen=True)
class NameRow:
    name: str
    image_id: str
    target_digest: str


@dataclass(frozen=True)
class LayerRow:
    id: int
    chain_id: str
    parent: str
    diff_id: str
    state: str
    bytes: int
    inodes: int


@dataclass(frozen=True)
class ActiveRow:
    id: int
    key: str
    image_id: str
    chain: list[str]
    mode: str
    created: float


class MetadataDB:
    """One connection; use it from one thread at a time (the daemon's event loop thread)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.conn = sqlitedb.open_db(path, _SCHEMA, SCHEMA_VERSION)
        self.local_generation = 0  # bumped on our own commits (data_version only counts other connections')

    def close(self) -> None:
        self.conn.close()

    @contextlib.contextmanager
    def tx(self, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """A write transaction (BEGIN IMMEDIATE: one writer at a time across processes).

        durable=False skips the fsync of this commit (WAL stays consistent; a crash may undo it). For layer
        bookkeeping: an fsync while tar is writing a layer flushes the layer's data with it (ext4 ordered mode),
        and losing such a row only means unpacking the layer again. The next durable commit syncs it anyway.
        """
        outermost = not self.conn.in_transaction
        with sqlitedb.transaction(self.conn, durable=durable, join=True) as conn:
            yield conn
        if outermost:
            self.local_generation += 1

    def version(self) -> tuple[int, int]:
        """Changes when anyone (this connection or another process) committed since the last call."""
        return self.conn.execute("PRAGMA data_version").fetchone()[0], self.local_generation

    # -- images and names ------------------------------------------------------------------------------------
    @staticmethod
    def _image(r: tuple) -> ImageRow:  # type: ignore[type-arg]
        return ImageRow(r[0], r[1], r[2], bytes(r[3]), json.loads(r[4]), json.loads(r[5]), r[6], bool(r[7]), r[8])

    _IMAGE_COLS = "id, manifest_digest, manifest_media_type, config, layers, blobs, size, pinned, created"

    def put_image(self, row: ImageRow, names: list[tuple[str, str]]) -> None:
        """Insert or merge an image and point `names` [(name, target digest)] at it, in one transaction."""
        with self.tx() as c:
            old = c.execute("SELECT blobs, pinned FROM images WHERE id=?", (row.id,)).fetchone()
            blobs = list(row.blobs)
            pinned = row.pinned
            if old:
                blobs = sorted(set(blobs) | set(json.loads(old[0])))
                pinned = pinned or bool(old[1])
                c.execute("UPDATE images SET manifest_digest=?, manifest_media_type=?, config=?, layers=?, blobs=?,"
                          " size=?, pinned=? WHERE id=?",
                          (row.manifest_digest, row.manifest_media_type, row.config, json.dumps(row.layers),
                           json.dumps(blobs), row.size, int(pinned), row.id))
            else:
                c.execute(f"INSERT INTO images({self._IMAGE_COLS}) VALUES(?,?,?,?,?,?,?,?,?)",
                          (row.id, row.manifest_digest, row.manifest_media_type, row.config,
                           json.dumps(row.layers), json.dumps(blobs), row.size, int(pinned), row.created))
            for name, target in names:
                c.execute("INSERT INTO names(name, image_id, target_digest) VALUES(?,?,?) ON CONFLICT(name) DO"
                          " UPDATE SET image_id=excluded.image_id, target_digest=excluded.target_digest",
                          (name, row.id, target))

    def images(self) -> list[ImageRow]:
        return [self._image(r) for r in self.conn.execute(f"SELECT {self._IMAGE_COLS} FROM images")]

    def image(self, image_id: str) -> ImageRow | None:
        r = self.conn.execute(f"SELECT {self._IMAGE_COLS} FROM images WHERE id=?", (image_id,)).fetchone()
        return self._image(r) if r else None

    def names(self) -> list[NameRow]:
        return [NameRow(*r) for r in self.conn.execute("SELECT name, image_id, target_digest FROM names")]

    def set_pinned(self, image_id: str, pinned: bool) -> bool:
        with self.tx() as c:
            return c.execute("UPDATE images SET pinned=? WHERE id=?", (int(pinned), image_id)).rowcount > 0

    def delete_image(self, image_id: str) -> bool:
        with self.tx() as c:
            c.execute("DELETE FROM names WHERE image_id=?", (image_id,))
            return c.execute("DELETE FROM images WHERE id=?", (image_id,)).rowcount > 0

    def delete_name(self, name: str) -> None:
        with self.tx() as c:
            c.execute("DELETE FROM names WHERE name=?", (name,))

    # -- layers ----------------------------------------------------------------------------------------------
    def layer(self, chain_id: str) -> LayerRow | None:
        r = self.conn.execute("SELECT id, chain_id, parent, diff_id, state, bytes, inodes FROM layers"
                              " WHERE chain_id=?", (chain_id,)).fetchone()
        return LayerRow(*r) if r else None

    def layers(self) -> list[LayerRow]:
        return [LayerRow(*r) for r in self.conn.execute(
            "SELECT id, chain_id, parent, diff_id, state, bytes, inodes FROM layers")]

    def begin_layer(self, chain_id: str, parent: str, diff_id: str) -> int:
        """Reserve a directory id for a layer about to be unpacked (replacing a stale reservation)."""
        with self.tx(durable=False) as c:
            c.execute("DELETE FROM layers WHERE chain_id=? AND state!='ready'", (chain_id,))
            cur = c.execute("INSERT INTO layers(chain_id, parent, diff_id, state, created) VALUES(?,?,?,?,?)",
                            (chain_id, parent, diff_id, "unpacking", time.time()))
            assert cur.lastrowid is not None
            return cur.lastrowid

    def finish_layer(self, layer_id: int, nbytes: int, inodes: int) -> None:
        with self.tx(durable=False) as c:
            c.execute("UPDATE layers SET state='ready', bytes=?, inodes=? WHERE id=?", (nbytes, inodes, layer_id))

    def delete_layer(self, layer_id: int) -> None:
        with self.tx(durable=False) as c:
            c.execute("DELETE FROM layers WHERE id=?", (layer_id,))

    # -- active snapshots ------------------------------------------------------------------------------------
    @staticmethod
    def _active(r: tuple) -> ActiveRow:  # type: ignore[type-arg]
        return ActiveRow(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5])

    def add_active(self, key: str, image_id: str, chain: list[str], mode: str) -> int | None:
        """Reserve an active snapshot; None if `key` exists."""
        with self.tx() as c:
            if c.execute("SELECT 1 FROM active WHERE key=?", (key,)).fetchone():
                return None
            cur = c.execute("INSERT INTO active(key, image_id, chain, mode, created) VALUES(?,?,?,?,?)",
                            (key, image_id, json.dumps(chain), mode, time.time()))
            assert cur.lastrowid is not None
            return cur.lastrowid

    def active(self, key: str) -> ActiveRow | None:
        r = self.conn.execute("SELECT id, key, image_id, chain, mode, created FROM active WHERE key=?",
                              (key,)).fetchone()
        return self._active(r) if r else None

    def actives(self) -> list[ActiveRow]:
        return [self._active(r) for r in self.conn.execute(
            "SELECT id, key, image_id, chain, mode, created FROM active")]

    def delete_active(self, key: str) -> None:
        with self.tx() as c:
            c.execute("DELETE FROM active WHERE key=?", (key,))
