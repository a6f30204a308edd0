"""The content store: blobs by digest under `<root>/blobs/<algo>/<hex>`, written only after verification.

Data goes to `<root>/ingest/<hex>.partial`, is checked for size and digest, fsynced and renamed into place, so a
blob that exists is complete and correct. One download per digest at a time, across tasks (a shared future) and
processes (flock); a short read or a cancel keeps the partial file for a ranged resume (until the next garbage
collection), a full disk (NoSpace) removes it. Knows nothing of registries.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from runtime.fsutil import fsync_dir

from .errors import ContentError, DigestMismatch, NoSpace, NotFound, ShortRead, SizeMismatch, is_no_space
from .locks import alock, try_lock_fd
from .reference import InvalidReference, validate_digest

log = logging.getLogger(__name__)

CHUNK = 1 << 20

# fetch(offset) -> (offset the data actually starts at, async iterator of chunks)
Fetcher = Callable[[int], Awaitable[tuple[int, AsyncIterator[bytes]]]]
ProgressFn = Callable[[int], None]  # called with the bytes of the blob present so far


class Sink(Protocol):
    async def feed(self, offset: int, chunk: bytes) -> None: ...


def _split(digest: str) -> tuple[str, str]:
    try:
        validate_digest(digest)
    except InvalidReference as e:
        raise ContentError(f"bad digest {digest!r}: {e.reason}") from None
    algo, hexpart = digest.split(":", 1)
    return algo, hexpart


def hash_file(path: str, algo: str = "sha256", limit: int | None = None) -> tuple[str, int]:
    """(digest, size) of a file's content, or of its first `limit` bytes."""
    h = hashlib.new(algo)
    n = 0
    with open(path, "rb") as f:
        while True:
            want = CHUNK if limit is None else min(CHUNK, limit - n)
            if want <= 0:
                break
            b = f.read(want)
            if not b:
                break
            h.update(b)
            n += len(b)
    return f"{algo}:{h.hexdigest()}", n


@dataclass(frozen=True)
class BlobInfo:
    digest: str
    size: int


class ContentStore:
    def __init__(self, root: str) -> None:
        self.root = root
        self.ingest_dir = os.path.join(root, "ingest")
        os.makedirs(os.path.join(root, "blobs", "sha256"), exist_ok=True)
        os.makedirs(self.ingest_dir, exist_ok=True)
        self._inflight: dict[str, asyncio.Future[str]] = {}

    # -- reading ---------------------------------------------------------------------------------------------
    def path(self, digest: str) -> str:
        algo, hexpart = _split(digest)
        return os.path.join(self.root, "blobs", algo, hexpart)

    def exists(self, digest: str) -> bool:
        return os.path.exists(self.path(digest))

    def size(self, digest: str) -> int | None:
        try:
            return os.stat(self.path(digest)).st_size
        except FileNotFoundError:
            return None

    def read(self, digest: str, max_size: int = 16 << 20) -> bytes:
        """A small blob's bytes (manifests, configs), re-verified: they are cheap to hash and drive everything."""
        p = self.path(digest)
        try:
            with open(p, "rb") as f:
                data = f.read(max_size + 1)
        except FileNotFoundError:
            raise NotFound(f"blob {digest} is not in the content store") from None
        if len(data) > max_size:
            raise ContentError(f"blob {digest}: larger than {max_size} bytes")
        algo, _ = _split(digest)
        actual = f"{algo}:{hashlib.new(algo, data).hexdigest()}"
        if actual != digest:
            raise DigestMismatch(f"stored blob {p}", digest, actual)
        return data

    def list(self) -> list[BlobInfo]:
        out = []
        base = os.path.join(self.root, "blobs")
        for algo in os.listdir(base):
            d = os.path.join(base, algo)
            with os.scandir(d) as it:
                for e in it:
                    if e.is_file(follow_symlinks=False):
                        out.append(BlobInfo(f"{algo}:{e.name}", e.stat(follow_symlinks=False).st_size))
        return out

    def verify(self, digest: str) -> None:
        algo, _ = _split(digest)
        actual, _n = hash_file(self.path(digest), algo)
        if actual != digest:
            raise DigestMismatch(f"stored blob {self.path(digest)}", digest, actual)

    # -- writing ---------------------------------------------------------------------------------------------
    def _commit(self, tmp: str, digest: str) -> str:
        dst = self.path(digest)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.rename(tmp, dst)
        fsync_dir(os.path.dirname(dst))
        return dst

    def put_bytes(self, data: bytes, expected: str | None = None, what: str = "blob") -> str:
        """Store `data`; if `expected` is given it must be its digest. Returns the digest."""
        algo = _split(expected)[0] if expected else "sha256"
        digest = f"{algo}:{hashlib.new(algo, data).hexdigest()}"
        if expected and digest != expected:
            raise DigestMismatch(what, expected, digest)
        if self.exists(digest):
            return digest
        tmp = ""
        try:
            fd, tmp = tempfile.mkstemp(dir=self.ingest_dir, prefix="bytes-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            self._commit(tmp, digest)
        except BaseException as e:
            if tmp:
                _unlink(tmp)
            if is_no_space(e):
                raise NoSpace(f"storing {what} {digest}", tmp or self.ingest_dir, len(data)) from None
            raise
        return digest

    def put_file(self, src: str, expected: str | None = None, expected_size: int | None = None,
                 what: str | None = None) -> BlobInfo:
        """Copy a local file in (imports), verifying size and digest when given."""
        what = what or src
        algo = _split(expected)[0] if expected else "sha256"
        h = hashlib.new(algo)
        tmp = ""
        n = 0
        try:
            fd, tmp = tempfile.mkstemp(dir=self.ingest_dir, prefix="file-")
            with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
                while b := inp.read(CHUNK):
                    h.update(b)
                    out.write(b)
                    n += len(b)
                digest = f"{algo}:{h.hexdigest()}"
                if expected_size is not None and n != expected_size:
                    raise SizeMismatch(what, expected_size, n)
                if expected and digest != expected:
                    raise DigestMismatch(what, expected, digest)
                out.flush()
                os.fsync(out.fileno())
            if self.exists(digest):
                _unlink(tmp)
            else:
                self._commit(tmp, digest)
        except BaseException as e:
            if tmp:
                _unlink(tmp)
            if is_no_space(e):
                needed = expected_size if expected_size is not None else _size_or_none(src)
                raise NoSpace(f"importing {what}", tmp or self.ingest_dir, needed, n) from None
            raise
        return BlobInfo(digest, n)

    async def ingest(self, digest: str, size: int, fetch: Fetcher, what: str = "",
                     progress: ProgressFn | None = None, sink: Sink | None = None) -> str:
        """Make `digest` present, downloading it with `fetch` unless it is there or being fetched already.
        `sink.feed(offset, chunk)` sees every chunk this call writes (not chunks another caller writes)."""
        _split(digest)
        if self.exists(digest):
            return self.path(digest)
        fut = self._inflight.get(digest)
        if fut is not None:
            await asyncio.shield(fut)
            return self.path(digest)
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # consumed: no "never retrieved" noise
        self._inflight[digest] = fut
        try:
            await self._ingest_locked(digest, size, fetch, what or digest, progress, sink)
            fut.set_result(self.path(digest))
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(e)
            raise
        finally:
            del self._inflight[digest]
        return self.path(digest)

    async def _ingest_locked(self, digest: str, size: int, fetch: Fetcher, what: str,
                             progress: ProgressFn | None, sink: Sink | None = None) -> None:
        algo, hexpart = _split(digest)
        lockp = os.path.join(self.ingest_dir, f"{hexpart}.lock")
        partial = os.path.join(self.ingest_dir, f"{hexpart}.partial")
        async with alock(lockp):
            if self.exists(digest):  # another process finished it while we waited
                return
            h = hashlib.new(algo)
            offset = 0
            if os.path.exists(partial):
                have = os.stat(partial).st_size
                if 0 < have <= size:
                    _d, offset = await asyncio.to_thread(_rehash, h, partial, have)
                    log.info("%s: resuming at %d of %d bytes", what, offset, size)
                else:
                    _unlink(partial)
            start, chunks = await fetch(offset)
            if start != offset:
                if start != 0:
                    raise ContentError(f"{what}: server resumed at {start}, wanted {offset} or 0")
                h = hashlib.new(algo)
                offset = 0
            written = offset
            try:
                fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    os.ftruncate(fd, offset)
                    os.lseek(fd, offset, os.SEEK_SET)
                    if progress:
                        progress(offset)
                    async for chunk in chunks:
                        written += len(chunk)
                        if written > size:
                            _unlink(partial)
                            raise SizeMismatch(what, size, written)
                        h.update(chunk)
                        _write_all(fd, chunk)
                        if progress:
                            progress(written)
                        if sink is not None:
                            await sink.feed(written - len(chunk), chunk)
                    await asyncio.to_thread(os.fsync, fd)
                finally:
                    os.close(fd)
            except OSError as e:
                if not is_no_space(e):
                    raise
                # A partial that filled the disk is useless for a resume (that needs the space too): drop it.
                err = NoSpace(f"downloading {what}", partial, size, _size_or_none(partial))  # free space: before
                _unlink(partial)
                raise err from None
            if written < size:
                raise ShortRead(what, size, written)
            actual = f"{algo}:{h.hexdigest()}"
            if actual != digest:
                _unlink(partial)
                raise DigestMismatch(what, digest, actual)
            self._commit(partial, digest)
            _unlink(lockp)  # harmless if a waiter re-creates it: it finds the blob and leaves

    def delete(self, digest: str) -> bool:
        try:
            os.unlink(self.path(digest))
            return True
        except FileNotFoundError:
            return False

    def discard_partial(self, digest: str) -> int:
        """Delete the partial download of `digest` unless someone (this process or another) is writing it;
        returns the bytes freed. For a pull that failed for lack of space: its partials only keep the disk full."""
        _algo, hexpart = _split(digest)
        if digest in self._inflight:
            return 0
        lockp = os.path.join(self.ingest_dir, f"{hexpart}.lock")
        partial = os.path.join(self.ingest_dir, f"{hexpart}.partial")
        if not os.path.exists(partial):
            return 0
        fd = try_lock_fd(lockp)
        if fd is None:
            return 0
        try:
            n = _size_or_none(partial) or 0
            _unlink(partial)
            # The .lock stays: unlinking a lock file another process may be about to flock would let two
            # writers lock different inodes. clean_ingest removes it under the exclusive GC lock.
        finally:
            os.close(fd)
        return n

    def clean_ingest(self) -> tuple[int, int]:
        """Remove every leftover of finished, abandoned or interrupted writes, partial downloads included;
        returns (files removed, bytes freed). Call only under the exclusive GC lock: then no download is in
        flight in any process, and a partial kept for a ranged resume is given up to free its space."""
        n = freed = 0
        for name in os.listdir(self.ingest_dir):
            if not (name.startswith(("bytes-", "file-")) or name.endswith((".lock", ".partial"))):
                continue
            p = os.path.join(self.ingest_dir, name)
            size = _size_or_none(p) or 0
            _unlink(p)
            n += 1
            freed += size
        return n, freed


def _rehash(h: hashlib._Hash, path: str, n: int) -> tuple[str, int]:
    got = 0
    with open(path, "rb") as f:
        while got < n:
            b = f.read(min(CHUNK, n - got))
            if not b:
                break
            h.update(b)
            got += len(b)
    return "", got


def _write_all(fd: int, data: bytes) -> None:
    mv = memoryview(data)
    while mv:
        n = os.write(fd, mv)
        mv = mv[n:]


def _size_or_none(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
