"""A full disk in the image store (issue 19 item 2) is NoSpace (RESOURCE_EXHAUSTED) wherever it happens, names
what was written where, and leaves no partial download; gc collects every partial download and counts it."""
from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import sqlite3

import pytest

from cri_server.images import content as contentmod
from cri_server.images.content import ContentStore
from cri_server.images.errors import NoSpace, is_no_space
from cri_server.images.metadata import ImageRow, MetadataDB
from tests.unit.images.test_images_content import fetcher

DATA = os.urandom(300_000)
DIGEST = "sha256:" + hashlib.sha256(DATA).hexdigest()


def _full_after(monkeypatch: pytest.MonkeyPatch, n_writes: int) -> None:
    real = contentmod._write_all
    calls = [0]

    def write_all(fd: int, data: bytes) -> None:
        calls[0] += 1
        if calls[0] > n_writes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)
    monkeypatch.setattr(contentmod, "_write_all", write_all)


def test_ingest_into_full_disk_is_no_space_and_keeps_no_partial(tmp_path, monkeypatch):
    cs = ContentStore(str(tmp_path))
    _full_after(monkeypatch, 2)
    with pytest.raises(NoSpace) as e:
        asyncio.run(cs.ingest(DIGEST, len(DATA), fetcher(DATA, []), "layer x"))
    assert e.value.code == "RESOURCE_EXHAUSTED"
    partial = os.path.join(cs.ingest_dir, DIGEST[7:] + ".partial")
    assert e.value.path == partial and e.value.needed == len(DATA) and e.value.written == 2 * 65536
    assert "downloading layer x: no space left on device writing " + partial in str(e.value)
    assert not os.path.exists(partial) and not cs.exists(DIGEST)


def test_put_bytes_into_full_disk_is_no_space(tmp_path, monkeypatch):
    cs = ContentStore(str(tmp_path))

    def fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(contentmod.os, "fsync", fsync)
    with pytest.raises(NoSpace) as e:
        cs.put_bytes(b"{}", None, "manifest")
    assert e.value.needed == 2 and "storing manifest" in str(e.value)
    assert os.listdir(cs.ingest_dir) == []


def test_gc_cleaning_removes_every_partial_and_counts_it(tmp_path):
    cs = ContentStore(str(tmp_path))
    with open(os.path.join(cs.ingest_dir, "ab" * 32 + ".partial"), "wb") as f:
        f.write(b"x" * 5000)  # fresh: before, only partials older than a day went
    with open(os.path.join(cs.ingest_dir, "ab" * 32 + ".lock"), "wb"):
        pass
    assert cs.clean_ingest() == (2, 5000)
    assert os.listdir(cs.ingest_dir) == []


def test_discard_partial_spares_a_download_in_flight(tmp_path):
    cs = ContentStore(str(tmp_path))
    partial = os.path.join(cs.ingest_dir, DIGEST[7:] + ".partial")
    with open(partial, "wb") as f:
        f.write(b"y" * 100)
    lockp = os.path.join(cs.ingest_dir, DIGEST[7:] + ".lock")
    from cri_server.images.locks import try_lock_fd
    fd = try_lock_fd(lockp)  # another process is writing it
    assert fd is not None
    try:
        assert cs.discard_partial(DIGEST) == 0 and os.path.exists(partial)
    finally:
        os.close(fd)
    assert cs.discard_partial(DIGEST) == 100 and not os.path.exists(partial)
    # its .lock stays for gc (clean_ingest, under the exclusive lock): unlinking a lock another process may be
    # about to flock would let two writers hold locks on different inodes
    assert os.path.exists(partial[:-len('.partial')] + '.lock')


def test_sqlite_full_is_no_space(tmp_path):
    db = MetadataDB(str(tmp_path / "meta.db"))
    try:
        pages = db.conn.execute("PRAGMA page_count").fetchone()[0]
        db.conn.execute(f"PRAGMA max_page_count={pages + 1}")  # a full disk, as SQLite reports it
        row = ImageRow(id="sha256:" + "c" * 64, manifest_digest="sha256:" + "d" * 64, manifest_media_type="x",
                       config=os.urandom(200_000), layers=[], blobs=[], size=1, pinned=False, created=0.0)
        with pytest.raises(sqlite3.OperationalError) as e:
            db.put_image(row, [])
        assert is_no_space(e.value)
    finally:
        db.close()
    assert not is_no_space(sqlite3.OperationalError("no such table: x"))
    assert is_no_space(OSError(errno.EDQUOT, "quota")) and not is_no_space(OSError(errno.EIO, "io"))


def test_writable_snapshot_on_full_disk_is_no_space_and_leaves_no_row(tmp_path, monkeypatch):
    import json

    from cri_server.images import snapshots
    from cri_server.images.service import ImageService

    def populate(base: str, layer_dirs: list[str], mode: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), base)
    monkeypatch.setattr(snapshots.Snapshotter, "_populate", staticmethod(populate))

    async def main() -> None:
        svc = ImageService(str(tmp_path), snapshot_mode="copy")
        try:
            config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                                 "rootfs": {"type": "layers", "diff_ids": []}}).encode()
            image_id = "sha256:" + hashlib.sha256(config).hexdigest()
            svc.db.put_image(ImageRow(id=image_id, manifest_digest="sha256:" + "d" * 64, manifest_media_type="x",
                                      config=config, layers=[], blobs=[], size=1, pinned=False, created=0.0), [])
            with pytest.raises(NoSpace) as e:
                await svc.prepare_rootfs(image_id, "ctr1")
            assert e.value.code == "RESOURCE_EXHAUSTED" and "writable snapshot 'ctr1'" in str(e.value)
            assert svc.db.active("ctr1") is None
        finally:
            await svc.close()
    asyncio.run(main())
