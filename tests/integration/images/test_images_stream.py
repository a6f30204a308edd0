"""Unpacking while downloading (LayerPipe): in-order, out-of-order and absent feeds give the same layer; a
failed download or a hostile layer leaves no layer, no temp dir and no stuck thread."""
from __future__ import annotations

import asyncio
import os

import pytest

from cri_server.images.builder import Entry, compress, layer_tar
from cri_server.images.errors import DigestMismatch, RegistryError, UnsafeLayer
from cri_server.images.manifest import sha256_digest
from cri_server.images.metadata import MetadataDB
from cri_server.images.snapshots import Snapshotter
from tests.support.imagetest import member, raw_tar, tree

pytestmark = pytest.mark.root

ENTRIES = [Entry("d", "dir"), Entry("d/big", "file", 0o644, data=os.urandom(3_000_000)),
           Entry("d/small", "file", 0o600, uid=7, data=b"s"), Entry("d/.wh.x", "file", 0o644)]


def _setup(tmp_path, raw: bytes):  # type: ignore[no-untyped-def]
    tmp_path.mkdir(parents=True, exist_ok=True)
    blob, _mt = compress(raw, "gzip")
    path = tmp_path / "blob"
    path.write_bytes(blob)
    snaps = Snapshotter(str(tmp_path / "snaps"), MetadataDB(str(tmp_path / "meta.db")))
    return snaps, blob, str(path), sha256_digest(raw)


def _download(blob: bytes, path: str, pattern: str, fail: bool = False):  # type: ignore[no-untyped-def]
    async def download(sink):  # type: ignore[no-untyped-def]
        if sink is not None and pattern != "none":
            step = 65536
            offsets = list(range(0, len(blob), step))
            if pattern == "restart":  # the first half, then the server starts over from 0
                offsets = offsets[: len(offsets) // 2] + offsets
            if pattern == "gap":
                del offsets[3]
            for off in offsets:
                await sink.feed(off, blob[off:off + step])
                if fail and off > len(blob) // 2:
                    raise RegistryError("connection reset")
                await asyncio.sleep(0)
        return path
    return download


@pytest.mark.parametrize("pattern", ["in-order", "restart", "gap", "none"])
def test_feeds_give_the_same_layer(tmp_path, pattern):
    snaps, blob, path, diff_id = _setup(tmp_path, layer_tar(ENTRIES))
    row = asyncio.run(snaps.ensure_layer_streaming(diff_id, "", diff_id, "L", _download(blob, path, pattern)))
    got = tree(snaps.layer_dir(row.id))
    want_snaps, _b, want_path, _d = _setup(tmp_path / "ref", layer_tar(ENTRIES))
    ref_row = asyncio.run(want_snaps.ensure_layer(diff_id, "", diff_id, want_path, "auto", "L"))
    assert got == tree(want_snaps.layer_dir(ref_row.id))
    assert os.listdir(snaps.tmp_dir) == []


def test_failed_download_leaves_nothing(tmp_path):
    snaps, blob, path, diff_id = _setup(tmp_path, layer_tar(ENTRIES))
    with pytest.raises(RegistryError):
        asyncio.run(asyncio.wait_for(
            snaps.ensure_layer_streaming(diff_id, "", diff_id, "L", _download(blob, path, "in-order", fail=True)),
            30))
    assert os.listdir(snaps.tmp_dir) == [] and snaps.db.layers() == []


def test_hostile_layer_streamed(tmp_path):
    snaps, blob, path, diff_id = _setup(tmp_path, raw_tar([member("a"), member("../../escape")]))
    with pytest.raises(UnsafeLayer):
        asyncio.run(snaps.ensure_layer_streaming(diff_id, "", diff_id, "L", _download(blob, path, "in-order")))
    assert os.listdir(snaps.tmp_dir) == [] and snaps.db.layers() == []
    assert not (tmp_path / "escape").exists()


def test_wrong_diff_id(tmp_path):
    snaps, blob, path, _diff_id = _setup(tmp_path, layer_tar(ENTRIES))
    other = "sha256:" + "0" * 64
    with pytest.raises(DigestMismatch, match="uncompressed"):
        asyncio.run(snaps.ensure_layer_streaming(other, "", other, "L", _download(blob, path, "in-order")))
    assert os.listdir(snaps.tmp_dir) == [] and snaps.db.layers() == []
