"""ImageService: the one object husk-cri (and the `husk-cri images` commands) use for images and container rootfs.

Owns `<root>/images/` (content store, snapshots, meta.db, gc.lock). Pulls, imports and rootfs preparation hold the
GC lock shared, garbage collection holds it exclusively, so the daemon and the CLI can work on the same root.
Call it from one asyncio event loop thread.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import gc as gcmod
from . import manifest as mf
from .auth import AuthConfig
from .content import ContentStore
from .errors import ImageError, InvalidReference, NoSpace, NotFound, SnapshotError, is_no_space
from .locks import alock, try_lock_fd
from .metadata import MetadataDB
from .pull import Progress, ProgressCallback, pull, unpack_layers
from .records import ImageRecord, build_record
from .reference import Reference, parse
from .snapshots import Mount, Snapshotter, Usage, disk_usage, mount_all, unmount

if TYPE_CHECKING:
    import aiohttp

    from . import pullworker
    from .registry import RegistryClient

log = logging.getLogger(__name__)

IMAGES_DIR = "images"
GC_RETRY_S = 10.0
_HEX_PREFIX = re.compile(r"(?:sha256:)?([0-9a-f]{1,64})")


@dataclass
class _SharedPull:
    task: asyncio.Future[ImageRecord]
    waiters: int = 0


@dataclass(frozen=True)
class FsInfo:
    """Usage of the filesystem holding images (ImageFsInfo)."""

    mountpoint: str  # the images directory
    used_bytes: int
    inodes_used: int
    timestamp_ns: int


class ImageService:
    def __init__(self, root: str, registry_config_dir: str | None = None, *, snapshot_mode: str = "auto",
                 applier: str = "gnutar", platform: str | mf.Platform | None = None,
                 max_concurrent_downloads: int = 3, plain_http: bool = False, retries: int = 3,
                 retry_backoff: float = 0.25, stream_unpack: bool = True, pull_worker: bool = False) -> None:
        self.base_root = os.path.abspath(root)
        self.root = os.path.join(self.base_root, IMAGES_DIR)
        os.makedirs(self.root, mode=0o711, exist_ok=True)
        self.registry_config_dir = registry_config_dir
        self.db = MetadataDB(os.path.join(self.root, "meta.db"))
        self.content = ContentStore(os.path.join(self.root, "content"))
        self.snapshots = Snapshotter(os.path.join(self.root, "snapshots"), self.db, snapshot_mode, applier)
        if platform is None:
            self.platform = mf.host_platform()
        elif isinstance(platform, str):
            self.platform = mf.parse_platform(platform)
        else:
            self.platform = platform
        self.max_concurrent_downloads = max_concurrent_downloads
        self.stream_unpack = stream_unpack
        self.plain_http = plain_http
        self.retries = retries
        self.retry_backoff = retry_backoff
        self.gc_lock_path = os.path.join(self.root, "gc.lock")
        # husk-cri pulls in a worker process (pullworker.py) so that it never imports the registry client
        self.pull_worker = pull_worker
        self._worker_options = {"snapshot_mode": snapshot_mode, "applier": applier,
                                "max_concurrent_downloads": max_concurrent_downloads, "plain_http": plain_http,
                                "retries": retries, "retry_backoff": retry_backoff, "stream_unpack": stream_unpack}
        self._session: aiohttp.ClientSession | None = None
        self._pulls: dict[tuple[str, str, AuthConfig | None, bool | None], _SharedPull] = {}
        self._cache_version: tuple[int, int] | None = None
        self._by_id: dict[str, ImageRecord] = {}
        self._by_name: dict[str, str] = {}
        self._gc_pending = False
        self._gc_task: asyncio.Task[gcmod.GCResult] | None = None
        self._gc_retry: asyncio.TimerHandle | None = None
        self._closed = False
        self._worker_pulls: set[asyncio.Task[ImageRecord]] = set()
        self._worker_pool: pullworker.WorkerPool | None = None   # idle workers, kept IDLE_S after a pull

    async def close(self) -> None:
        self._closed = True
        if self._worker_pool is not None:   # a worker stuck in its cleanup must not hold husk-cri's stop for long
            from .pullworker import SHUTDOWN_STOP_TIMEOUT_S
            self._worker_pool.stop_timeout = SHUTDOWN_STOP_TIMEOUT_S
        if self._worker_pulls:  # husk-cri stopping: each worker cancels its pull and cleans up
            for t in self._worker_pulls:
                t.cancel()
            await asyncio.gather(*self._worker_pulls, return_exceptions=True)
        if self._worker_pool is not None:
            await self._worker_pool.close()
        if self._gc_retry is not None:
            self._gc_retry.cancel()
            self._gc_retry = None
        if self._gc_task is not None:
            await asyncio.gather(self._gc_task, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.db.close()

    def _client(self, auth: AuthConfig | None, plain_http: bool | None = None) -> RegistryClient:
        from .registry import (  # aiohttp: imported by the first pull only
            RegistryClient,
            new_session,
        )
        if self._session is None or self._session.closed:
            self._session = new_session()
        return RegistryClient(self._session, self.registry_config_dir, auth,
                              plain_http=self.plain_http if plain_http is None else plain_http,
                              retries=self.retries, backoff=self.retry_backoff)

    # -- records ---------------------------------------------------------------------------------------------
    def _index(self) -> tuple[dict[str, ImageRecord], dict[str, str]]:
        v = self.db.version()
        if v != self._cache_version:
            names_by_image: dict[str, list] = {}  # type: ignore[type-arg]
            by_name: dict[str, str] = {}
            for n in self.db.names():
                names_by_image.setdefault(n.image_id, []).append(n)
                by_name[n.name] = n.image_id
            by_id = {}
            for row in self.db.images():
                try:
                    by_id[row.id] = build_record(row, names_by_image.get(row.id, []))
                except ImageError as e:
                    log.error("image %s: unreadable record: %s", row.id, e)
            self._by_id, self._by_name, self._cache_version = by_id, by_name, v
        return self._by_id, self._by_name

    def list(self) -> list[ImageRecord]:
        by_id, _ = self._index()
        return sorted(by_id.values(), key=lambda r: r.id)

    def get(self, ref_or_id: str) -> ImageRecord | None:
        """Look an image up by id (`sha256:<hex>` or `<hex>`), tag, digest reference, or unique id prefix."""
        by_id, by_name = self._index()
        s = ref_or_id.strip()
        if not s:
            return None
        if s.startswith("sha256:") and len(s) == 71:
            return by_id.get(s)
        if len(s) == 64 and _HEX_PREFIX.fullmatch(s):
            return by_id.get("sha256:" + s)
        try:
            ref = parse(s)
        except InvalidReference:
            ref = None
        if ref is not None:
            image_id = by_name.get(str(ref))
            if image_id is not None:
                return by_id.get(image_id)
        m = _HEX_PREFIX.fullmatch(s)
        if m:
            hits = [r for i, r in by_id.items() if i[7:].startswith(m.group(1))]
            if len(hits) == 1:
                return hits[0]
        return None

    def resolve(self, ref_or_id: str) -> ImageRecord:
        rec = self.get(ref_or_id)
        if rec is None:
            raise NotFound(f"image {ref_or_id!r} not found")
        return rec

    def set_pinned(self, ref_or_id: str, pinned: bool = True) -> ImageRecord:
        rec = self.resolve(ref_or_id)
        self.db.set_pinned(rec.id, pinned)
        return self.resolve(rec.id)

    # -- pull ------------------------------------------------------------------------------------------------
    async def pull(self, ref: str, auth: AuthConfig | None = None, platform: str | mf.Platform | None = None,
                   progress: ProgressCallback | None = None, plain_http: bool | None = None) -> ImageRecord:
        """Pull `ref` and return its record. Concurrent pulls of the same reference share one download."""
        r = parse(ref)
        plat = self.platform if platform is None else (
            mf.parse_platform(platform) if isinstance(platform, str) else platform)
        key = (str(r), str(plat), auth, plain_http)
        entry = self._pulls.get(key) if progress is None else None
        if entry is None:
            entry = _SharedPull(asyncio.ensure_future(self._pull(r, auth, plat, progress, plain_http)))
            if progress is None:
                self._pulls[key] = entry
                entry.task.add_done_callback(lambda _t: self._pulls.pop(key, None))
        entry.waiters += 1
        try:
            return await asyncio.shield(entry.task)
        finally:
            entry.waiters -= 1
            # A caller that gives up (kubelet's deadline) stops the work, unless another still waits for it.
            if entry.waiters == 0 and not entry.task.done():
                entry.task.cancel()
                if self._pulls.get(key) is entry:
                    del self._pulls[key]

    async def _pull(self, ref: Reference, auth: AuthConfig | None, plat: mf.Platform,
                    progress: ProgressCallback | None, plain_http: bool | None) -> ImageRecord:
        if self.pull_worker and progress is None:
            return await self._pull_in_worker(ref, auth, plat, plain_http)
        t0 = time.monotonic()
        try:
            async with alock(self.gc_lock_path, shared=True):
                client = self._client(auth, plain_http)
                row, names = await pull(client, self.content, self.snapshots, ref, plat, progress,
                                        self.max_concurrent_downloads, self.stream_unpack)
                self.db.put_image(row, names)
        except Exception as e:  # noqa: BLE001 - only a full disk is handled here
            if not is_no_space(e):
                raise
            raise await self._no_space(e, f"pulling {ref}") from None
        log.info("pulled %s as %s in %.2fs", ref, row.id, time.monotonic() - t0)
        self._after_write()
        return self.resolve(row.id)

    async def _pull_in_worker(self, ref: Reference, auth: AuthConfig | None, plat: mf.Platform,
                              plain_http: bool | None) -> ImageRecord:
        """The pull done by a worker process on the same root (pullworker.py); the metrics hooks and the records
        are this process's: the image is read back from meta.db."""
        from . import pull as pullmod
        from . import pullworker
        t0 = time.monotonic()
        task = asyncio.current_task()
        if pullmod.on_pull is not None and task is not None:
            pullmod.on_pull(task, t0)
        if task is not None:
            self._worker_pulls.add(task)  # type: ignore[arg-type]
        try:
            if self._worker_pool is None:
                self._worker_pool = pullworker.WorkerPool()
            res = await pullworker.run(str(ref), auth, plat, plain_http, self.base_root, self.registry_config_dir,
                                       self._worker_options, pool=self._worker_pool)
        except NoSpace:
            # the worker collected what it could; one here too, retried after pulls that held the lock
            self._gc_pending = True
            if not self._closed:
                self._schedule_gc()
            raise
        finally:
            self._worker_pulls.discard(task)  # type: ignore[arg-type]
        if res.fetched and pullmod.on_fetched is not None:
            pullmod.on_fetched(res.fetched)
        log.info("pulled %s as %s in %.2fs (in worker %d, pull %d: %.2fs pulling, %d bytes fetched)", ref,
                 res.image_id, time.monotonic() - t0, res.pid, res.served, res.seconds, res.fetched,
                 extra={"pull": res.pull_id})
        self._after_write()
        return self.resolve(res.image_id)

    async def _no_space(self, e: BaseException, what: str) -> NoSpace:
        """The NoSpace (RESOURCE_EXHAUSTED) for a full disk met anywhere (a download, tar, a snapshot, meta.db),
        after a garbage collection has freed what the failed work left (unreferenced blobs and layers, partial
        downloads), so that the failure does not leave the disk full."""
        err = e if isinstance(e, NoSpace) else NoSpace(what, getattr(e, "filename", None) or self.root)
        log.warning("%s", err)
        if not self._closed:
            try:
                res = await self.gc()
            except Exception as gc_err:  # noqa: BLE001 - the full disk is the error to report
                log.warning("gc after running out of space failed: %s", gc_err)
            else:
                if not res.skipped:
                    log.info("gc after running out of space freed %d bytes", res.bytes_freed)
        return err

    # -- import / export -------------------------------------------------------------------------------------
    async def import_archive(self, path: str, names: list[str] | None = None, base_name: str | None = None,
                             platform: str | mf.Platform | None = None, all_platforms: bool = False) -> list[ImageRecord]:
        """Import an OCI layout (directory or tar) or a docker-archive tar; unpack its layers; return records."""
        from . import archive
        plat = self.platform if platform is None else (
            mf.parse_platform(platform) if isinstance(platform, str) else platform)
        explicit = [parse(n) for n in names or []]
        try:
            async with alock(self.gc_lock_path, shared=True):
                images = await asyncio.to_thread(archive.read_archive, path, self.content, plat, all_platforms,
                                                 os.path.join(self.root, "tmp"))
                if explicit and len(images) != 1:
                    raise ImageError(f"{path}: --name needs an archive with exactly one image ({len(images)} found)")
                out_ids = []
                for img in images:
                    await unpack_layers(self.content, self.snapshots, img.row.layers, f"{path}: {img.row.id}")
                    img_names = archive.names_for(img, explicit, base_name)
                    self.db.put_image(img.row, img_names)
                    out_ids.append(img.row.id)
        except Exception as e:  # noqa: BLE001 - only a full disk is handled here
            if not is_no_space(e):
                raise
            raise await self._no_space(e, f"importing {path}") from None
        self._after_write()
        return [self.resolve(i) for i in out_ids]

    async def build_pause_image(self, ref: str, catatonit: str = "/usr/bin/catatonit",
                                pin: bool = True) -> ImageRecord:
        """Build the sandbox image locally (a static catatonit as /pause, `/pause -P`, user 65535) and import
        it as `ref`, pinned: for nodes that cannot reach a registry."""
        import shutil
        import tempfile

        from . import builder
        if not os.path.isfile(catatonit):
            raise ImageError(f"cannot build the pause image: {catatonit} does not exist (install catatonit)")
        tmp_root = os.path.join(self.root, "tmp")
        os.makedirs(tmp_root, exist_ok=True)
        async with alock(self.gc_lock_path, shared=True):  # GC cleans tmp/ under the exclusive lock
            tmp = tempfile.mkdtemp(prefix="pause-", dir=tmp_root)
            try:
                built = await asyncio.to_thread(builder.write_image, tmp, builder.pause_image(catatonit),
                                                builder.LayerCache())
                (rec,) = await self.import_archive(built.layout, names=[ref])
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return self.set_pinned(rec.id, True) if pin else rec

    async def export(self, refs: list[str], path: str, fmt: str = "oci") -> None:
        """Write images to `path`: an OCI layout tar (`oci`), an OCI layout directory (`oci-dir`) or a
        docker-archive tar (`docker`)."""
        from . import archive
        recs = []
        for r in refs:
            rec = self.resolve(r)
            row = self.db.image(rec.id)
            assert row is not None
            wanted = [t for t in rec.repo_tags if _same_image_ref(r, t)] or list(rec.repo_tags)
            recs.append((rec, row, wanted))
        async with alock(self.gc_lock_path, shared=True):
            await asyncio.to_thread(archive.write_archive, recs, self.content, path, fmt)

    # -- remove and garbage collection -----------------------------------------------------------------------
    async def remove(self, ref_or_id: str, collect: bool = True) -> bool:
        """Remove the image `ref_or_id` names, with all its tags and digests; False if there was none.
        Records vanish at once; disk space is freed by a garbage collection started here in the background
        (unless `collect` is False: then by the next one)."""
        rec = self.get(ref_or_id)
        if rec is None:
            return False
        self.db.delete_image(rec.id)
        self._gc_pending = True
        if collect:
            self._schedule_gc()
        return True

    def _after_write(self) -> None:
        if self._gc_pending:
            self._schedule_gc()

    def _retry_gc(self) -> None:
        self._gc_retry = None
        if self._gc_pending and not self._closed:
            self._schedule_gc()

    def _schedule_gc(self) -> None:
        if self._gc_task is None or self._gc_task.done():
            self._gc_task = asyncio.ensure_future(self.gc())

    async def gc(self, wait: bool = False) -> gcmod.GCResult:
        """Collect unreferenced blobs and layers. Without `wait`, gives up (skipped=True) when a pull or an
        import holds the lock; it is retried after the next one."""
        if wait:
            async with alock(self.gc_lock_path):
                return await self._gc_locked()
        fd = try_lock_fd(self.gc_lock_path)
        if fd is None:
            # A pull or import (perhaps in the CLI's process) holds the lock: try again after it, or soon.
            self._gc_pending = True
            if self._gc_retry is None:
                self._gc_retry = asyncio.get_running_loop().call_later(GC_RETRY_S, self._retry_gc)
            return gcmod.GCResult(skipped=True)
        try:
            return await self._gc_locked()
        finally:
            os.close(fd)

    async def _gc_locked(self) -> gcmod.GCResult:
        self._gc_pending = False
        p = gcmod.plan(self.db, self.content, self.snapshots)
        sizes = {x.id: x.bytes for x in self.db.layers()}
        freed_layers = 0
        for lid in p.layer_ids:
            freed_layers += sizes.get(lid, 0)
            self.db.delete_layer(lid)
        nblobs, freed = await asyncio.to_thread(gcmod.execute, p, self.content, self.snapshots,
                                                os.path.join(self.root, "tmp"))
        if nblobs or p.layer_ids:
            log.info("gc: removed %d blobs and %d layers", nblobs, len(p.layer_ids))
        return gcmod.GCResult(nblobs, len(p.layer_ids), freed + freed_layers)

    # -- usage -----------------------------------------------------------------------------------------------
    def fs_info(self) -> FsInfo:
        """Bytes and inodes used by images: blobs, unpacked layers and the metadata file (no tree walk)."""
        used = inodes = 0
        for layer in self.db.layers():
            used += layer.bytes
            inodes += layer.inodes
        for b in self.content.list():
            used += b.size
            inodes += 1
        for name in os.listdir(self.root):
            if name.startswith("meta.db"):
                used += os.stat(os.path.join(self.root, name)).st_size
                inodes += 1
        return FsInfo(self.root, used, inodes, time.time_ns())

    # -- container root filesystems --------------------------------------------------------------------------
    async def prepare_rootfs(self, image: str, key: str) -> list[Mount]:
        """Create the writable snapshot `key` (e.g. the container id) over `image`'s layers; return the mounts
        that make the container's root filesystem (overlay, or a bind mount of a plain copy)."""
        rec = self.resolve(image)
        row = self.db.image(rec.id)
        assert row is not None
        try:
            async with alock(self.gc_lock_path, shared=True):
                await unpack_layers(self.content, self.snapshots, row.layers, f"image {rec.id}")
                mounts = await self.snapshots.prepare(key, rec.id, list(rec.chain_ids))
        except Exception as e:  # noqa: BLE001 - only a full disk is handled here
            if not is_no_space(e):
                raise
            raise await self._no_space(e, f"creating the writable snapshot {key!r} of image {rec.id}") from None
        self._after_write()
        return mounts

    def mounts(self, key: str) -> list[Mount]:
        return self.snapshots.mounts(key)

    def mount(self, key: str, target: str) -> None:
        """Mount snapshot `key` on `target` (for tools and tests; the shim normally mounts `mounts(key)`)."""
        mount_all(self.snapshots.mounts(key), target)

    @staticmethod
    def unmount(target: str) -> None:
        unmount(target)

    async def remove_snapshot(self, key: str) -> bool:
        """Delete the writable snapshot `key` (unmounted first by the caller); idempotent."""
        try:
            return await self.snapshots.remove(key)
        except OSError as e:
            raise SnapshotError(f"remove snapshot {key!r}: {e}") from None

    def usage(self, key: str) -> Usage:
        """Bytes and inodes written by the container (its upper directory). Walks the tree."""
        return self.snapshots.usage(key)

    def snapshot_keys(self) -> list[str]:
        return [a.key for a in self.db.actives()]

    def containers_fs_info(self) -> FsInfo:
        """Usage of all writable snapshots together (CRI's container_filesystems). Walks every upper dir."""
        u = disk_usage(self.snapshots.active_dir)
        return FsInfo(self.snapshots.active_dir, u.bytes, u.inodes, time.time_ns())


def _same_image_ref(asked: str, tag: str) -> bool:
    try:
        return str(parse(asked)) == tag
    except InvalidReference:
        return False


__all__ = ["AuthConfig", "FsInfo", "ImageRecord", "ImageService", "Mount", "Progress", "Usage"]
