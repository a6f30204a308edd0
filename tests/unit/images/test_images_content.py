"""Content store: verified atomic commits, no blob after a mismatch or short read, resume, one download."""
from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

from cri_server.images.content import ContentStore
from cri_server.images.errors import DigestMismatch, NotFound, ShortRead, SizeMismatch

DATA = os.urandom(300_000)
DIGEST = "sha256:" + hashlib.sha256(DATA).hexdigest()


def fetcher(data: bytes, calls: list[int], honour_range: bool = True, cut: int | None = None, delay: float = 0):  # type: ignore[no-untyped-def]
    async def fetch(offset: int):  # type: ignore[no-untyped-def]
        calls.append(offset)
        start = offset if honour_range else 0
        body = data[start:cut] if cut is not None else data[start:]

        async def chunks():  # type: ignore[no-untyped-def]
            for i in range(0, len(body), 65536):
                if delay:
                    await asyncio.sleep(delay)
                yield body[i:i + 65536]
        return start, chunks()
    return fetch


def run(c):  # type: ignore[no-untyped-def]
    return asyncio.run(c)


def test_ingest_and_read(tmp_path):
    cs = ContentStore(str(tmp_path))
    calls: list[int] = []
    seen: list[int] = []
    path = run(cs.ingest(DIGEST, len(DATA), fetcher(DATA, calls), progress=seen.append))
    assert open(path, "rb").read() == DATA and calls == [0] and seen[-1] == len(DATA)
    assert cs.exists(DIGEST) and cs.size(DIGEST) == len(DATA)
    run(cs.ingest(DIGEST, len(DATA), fetcher(DATA, calls)))
    assert calls == [0]  # present: not fetched again
    assert [b.digest for b in cs.list()] == [DIGEST]
    cs.verify(DIGEST)
    with pytest.raises(NotFound):
        cs.read("sha256:" + "0" * 64)


def test_mismatch_leaves_nothing(tmp_path):
    cs = ContentStore(str(tmp_path))
    bad = bytearray(DATA)
    bad[1000] ^= 1
    with pytest.raises(DigestMismatch):
        run(cs.ingest(DIGEST, len(DATA), fetcher(bytes(bad), [])))
    assert not cs.exists(DIGEST) and not [n for n in os.listdir(cs.ingest_dir) if n.endswith(".partial")]
    with pytest.raises(SizeMismatch):
        run(cs.ingest(DIGEST, len(DATA), fetcher(DATA + b"extra", [])))
    assert not cs.exists(DIGEST) and not [n for n in os.listdir(cs.ingest_dir) if n.endswith(".partial")]


def test_short_read_then_resume(tmp_path):
    cs = ContentStore(str(tmp_path))
    calls: list[int] = []
    with pytest.raises(ShortRead):
        run(cs.ingest(DIGEST, len(DATA), fetcher(DATA, calls, cut=100_000)))
    assert not cs.exists(DIGEST)
    run(cs.ingest(DIGEST, len(DATA), fetcher(DATA, calls)))
    assert calls == [0, 100_000] and cs.read(DIGEST, max_size=len(DATA)) == DATA


def test_restart_when_the_server_ignores_range(tmp_path):
    cs = ContentStore(str(tmp_path))
    calls: list[int] = []
    with pytest.raises(ShortRead):
        run(cs.ingest(DIGEST, len(DATA), fetcher(DATA, calls, cut=100_000)))
    run(cs.ingest(DIGEST, len(DATA), fetcher(DATA, calls, honour_range=False)))
    assert calls == [0, 100_000] and cs.read(DIGEST, max_size=len(DATA)) == DATA


def test_concurrent_ingest_fetches_once(tmp_path):
    cs = ContentStore(str(tmp_path))
    calls: list[int] = []

    async def main():  # type: ignore[no-untyped-def]
        f = fetcher(DATA, calls, delay=0.001)
        return await asyncio.gather(*(cs.ingest(DIGEST, len(DATA), f) for _ in range(5)))
    paths = run(main())
    assert len(set(paths)) == 1 and calls == [0]


def test_put_bytes_and_file(tmp_path):
    cs = ContentStore(str(tmp_path / "cs"))
    assert cs.put_bytes(b"abc") == "sha256:" + hashlib.sha256(b"abc").hexdigest()
    with pytest.raises(DigestMismatch):
        cs.put_bytes(b"abc", "sha256:" + "0" * 64)
    src = tmp_path / "f"
    src.write_bytes(DATA)
    info = cs.put_file(str(src), DIGEST, len(DATA))
    assert info.digest == DIGEST
    with pytest.raises(SizeMismatch):
        cs.put_file(str(src), None, 5)
    assert sorted(os.listdir(cs.ingest_dir)) == []
