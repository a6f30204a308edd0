"""Snapshots: each layer unpacked once into `layers/<n>` (n recorded against its chain id), and per-container
writable snapshots `active/<n>/{fs,work}` mounted as overlayfs over the layer chain, or (no overlayfs) a plain copy
of the merged layers. Owns those directories and their rows; knows nothing of registries or image names.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from . import unpack
from .errors import DigestMismatch, SnapshotError, SnapshotExists, SnapshotNotFound
from .locks import alock
from .metadata import ActiveRow, LayerRow, MetadataDB
from .stream import LayerPipe

# download(sink) fetches a blob into the content store, feeding `sink` if given, and returns its path.
Download = Callable[[LayerPipe | None], Awaitable[str]]

log = logging.getLogger(__name__)

MODE_OVERLAY = "overlay"
MODE_COPY = "copy"
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Mount:
    """One mount, in the form containerd's task API carries rootfs mounts (type, source, options)."""

    type: str
    source: str
    options: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {"type": self.type, "source": self.source, "options": list(self.options)}


@dataclass(frozen=True)
class Usage:
    bytes: int
    inodes: int


def disk_usage(path: str) -> Usage:
    """Allocated bytes (st_blocks) and inodes under `path`, each hard-linked inode counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [path]
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Usage(0, 0)
    seen.add((st.st_dev, st.st_ino))
    total += st.st_blocks * 512
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except (FileNotFoundError, NotADirectoryError):
            continue
        with it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                key = (st.st_dev, st.st_ino)
                if key not in seen:
                    seen.add(key)
                    total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(e.path)
    return Usage(total, len(seen))


_overlay_probe: dict[str, bool] = {}


def overlay_supported(workdir: str) -> bool:
    """Whether an overlay mount works with upper and lower dirs on the filesystem of `workdir` (cached)."""
    if workdir in _overlay_probe:
        return _overlay_probe[workdir]
    ok = False
    try:
        with open("/proc/filesystems") as f:
            known = any(line.split()[-1] == "overlay" for line in f if line.strip())
    except OSError:
        known = False
    if known and os.geteuid() == 0:
        from runtime.linux import syscalls
        d = tempfile.mkdtemp(prefix="overlay-probe-", dir=workdir)
        try:
            for sub in ("lower", "upper", "work", "merged"):
                os.mkdir(os.path.join(d, sub))
            try:
                syscalls.mount("overlay", os.path.join(d, "merged"), "overlay", 0,
                               f"lowerdir={d}/lower,upperdir={d}/upper,workdir={d}/work")
                syscalls.umount2(os.path.join(d, "merged"), 0)
                ok = True
            except OSError as e:
                log.warning("overlayfs unusable under %s (%s): using plain copies for snapshots", workdir, e)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    _overlay_probe[workdir] = ok
    return ok


def _index_option() -> list[str]:
    # With index=on, overlayfs ties a lower layer to one upper: shared layers would refuse a second mount.
    return ["index=off"] if os.path.exists("/sys/module/overlay/parameters/index") else []


class Snapshotter:
    def __init__(self, root: str, db: MetadataDB, mode: str = "auto", applier: str = "gnutar") -> None:
        self.root = root
        self.db = db
        self.layers_dir = os.path.join(root, "layers")
        self.active_dir = os.path.join(root, "active")
        self.tmp_dir = os.path.join(root, "tmp")
        self.locks_dir = os.path.join(root, "locks")
        self.empty_dir = os.path.join(root, "empty")
        for d in (self.layers_dir, self.active_dir, self.tmp_dir, self.locks_dir, self.empty_dir):
            os.makedirs(d, exist_ok=True)
        if mode not in ("auto", MODE_OVERLAY, MODE_COPY):
            raise SnapshotError(f"unknown snapshot mode {mode!r} (auto, overlay, copy)")
        self._mode = mode
        if applier not in unpack.APPLIERS:
            raise SnapshotError(f"unknown layer applier {applier!r} ({', '.join(unpack.APPLIERS)})")
        self.applier = applier
        self._inflight: dict[str, asyncio.Future[LayerRow]] = {}

    @property
    def mode(self) -> str:
        if self._mode == "auto":
            self._mode = MODE_OVERLAY if overlay_supported(self.tmp_dir) else MODE_COPY
        return self._mode

    # -- layers ----------------------------------------------------------------------------------------------
    def layer_dir(self, layer_id: int) -> str:
        return os.path.join(self.layers_dir, str(layer_id))

    def ready_layer(self, chain_id: str) -> LayerRow | None:
        row = self.db.layer(chain_id)
        if row is None or row.state != "ready" or not os.path.isdir(self.layer_dir(row.id)):
            return None
        return row

    async def ensure_layer(self, chain_id: str, parent: str, diff_id: str, blob_path: str, compression: str,
                           what: str) -> LayerRow:
        """Unpack a layer blob once for `chain_id` (shared by concurrent callers and processes)."""
        return await self._ensure(chain_id, parent, diff_id, what, blob_path=blob_path, compression=compression)

    async def ensure_layer_streaming(self, chain_id: str, parent: str, diff_id: str, what: str,
                                     download: Download) -> LayerRow:
        """Download a layer blob with `download(sink)` and unpack it at the same time (once for `chain_id`).
        The blob is verified by the download, the unpacked stream by its diff_id, before either is kept."""
        if self.ready_layer(chain_id) is not None or chain_id in self._inflight:
            path = await download(None)
            return await self.ensure_layer(chain_id, parent, diff_id, path, "auto", what)
        return await self._ensure(chain_id, parent, diff_id, what, download=download)

    async def _ensure(self, chain_id: str, parent: str, diff_id: str, what: str, blob_path: str | None = None,
                      compression: str = "auto", download: Download | None = None) -> LayerRow:
        row = self.ready_layer(chain_id)
        if row is not None:
            return row
        fut = self._inflight.get(chain_id)
        if fut is not None:
            return await asyncio.shield(fut)
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._inflight[chain_id] = fut
        try:
            row = await self._unpack_locked(chain_id, parent, diff_id, what, blob_path, compression, download)
            fut.set_result(row)
            return row
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(e)
            raise
        finally:
            del self._inflight[chain_id]

    async def _unpack_locked(self, chain_id: str, parent: str, diff_id: str, what: str, blob_path: str | None,
                             compression: str, download: Download | None) -> LayerRow:
        hexpart = chain_id.split(":", 1)[1]
        async with alock(os.path.join(self.locks_dir, hexpart + ".lock")):
            row = self.ready_layer(chain_id)
            if row is not None:  # another process unpacked it while we waited
                if download is not None:
                    await download(None)
                return row
            stale = self.db.layer(chain_id)
            if stale is not None:  # a crash left a reservation, or the directory was lost: start over
                shutil.rmtree(self.layer_dir(stale.id), ignore_errors=True)
                self.db.delete_layer(stale.id)
            layer_id = self.db.begin_layer(chain_id, parent, diff_id)
            tmp = tempfile.mkdtemp(prefix=f"{layer_id}-", dir=self.tmp_dir)
            os.chmod(tmp, 0o755)
            cancel = threading.Event()
            pipe = LayerPipe() if download is not None else None
            apply = unpack.APPLIERS[self.applier]
            task = asyncio.ensure_future(asyncio.to_thread(self._apply, apply, pipe or blob_path, compression, tmp,
                                                           what, cancel))
            try:
                if download is not None and pipe is not None:
                    path = await download(pipe)
                    await pipe.finish(path)
                result, usage = await asyncio.shield(task)
                if result.diff_id != diff_id:
                    raise DigestMismatch(f"{what} (uncompressed)", diff_id, result.diff_id)
                os.rename(tmp, self.layer_dir(layer_id))
            except BaseException:
                # Stop the worker (it checks between chunks) and wait for it before deleting its directory.
                cancel.set()
                if pipe is not None:
                    pipe.abort()
                # Wait until it has ended (and killed its tar) even if cancelled again meanwhile (run_all cancels a
                # sibling that is already cleaning up after its own error): `await task` would then give up at once
                # and leave tar writing into the directory removed below, its space held until it exits.
                while not task.done():
                    try:
                        await asyncio.wait({task})
                    except asyncio.CancelledError:  # the first error is the one to report
                        continue
                if not task.cancelled():
                    task.exception()  # retrieved: the first error is the one to report
                shutil.rmtree(tmp, ignore_errors=True)
                self.db.delete_layer(layer_id)
                raise
            self.db.finish_layer(layer_id, usage.bytes, usage.inodes)
            log.info("unpacked %s as layer %d (%s, %d members%s)", what, layer_id, chain_id, result.members,
                     ", streamed" if pipe is not None else "")
            row = self.db.layer(chain_id)
            assert row is not None
            return row

    @staticmethod
    def _apply(apply, source: str | LayerPipe, compression: str, dest: str, what: str,  # type: ignore[no-untyped-def]
               cancel: threading.Event) -> tuple[unpack.ApplyResult, Usage]:
        result = apply(source, compression, dest, what, cancel)
        return result, disk_usage(dest)

    # -- active (writable) snapshots -------------------------------------------------------------------------
    def active_path(self, row: ActiveRow) -> str:
        return os.path.join(self.active_dir, str(row.id))

    def upper_dir(self, key: str) -> str:
        return os.path.join(self.active_path(self._active(key)), "fs")

    def _active(self, key: str) -> ActiveRow:
        row = self.db.active(key)
        if row is None:
            raise SnapshotNotFound(key)
        return row

    async def prepare(self, key: str, image_id: str, chain: list[str]) -> list[Mount]:
        """Create the writable snapshot `key` over the layers of `chain` (bottom first); return its mounts.
        The layers must be ready. Database work stays on the caller's thread; copying runs in a worker."""
        if not key:
            raise SnapshotError("snapshot key must not be empty")
        rows = []
        for c in chain:
            r = self.ready_layer(c)
            if r is None:
                raise SnapshotError(f"layer {c} is not unpacked")
            rows.append(r)
        mode = self.mode
        sid = self.db.add_active(key, image_id, chain, mode)
        if sid is None:
            raise SnapshotExists(key)
        base = os.path.join(self.active_dir, str(sid))
        try:
            await asyncio.to_thread(self._populate, base, [self.layer_dir(r.id) for r in rows], mode)
        except BaseException:
            self.db.delete_active(key)
            raise
        return self.mounts(key)

    @staticmethod
    def _populate(base: str, layer_dirs: list[str], mode: str) -> None:
        try:
            if os.path.exists(base):  # left by a crash between insert and cleanup of an older run
                shutil.rmtree(base)
            os.mkdir(base, 0o711)
            os.mkdir(os.path.join(base, "fs"), 0o755)
            os.mkdir(os.path.join(base, "work"), 0o700)
            if mode == MODE_COPY:
                for d in layer_dirs:
                    _copy_layer(d, os.path.join(base, "fs"))
        except BaseException:
            shutil.rmtree(base, ignore_errors=True)
            raise

    def mounts(self, key: str) -> list[Mount]:
        row = self._active(key)
        base = self.active_path(row)
        if row.mode == MODE_COPY:
            return [Mount("bind", os.path.join(base, "fs"), ("rbind", "rw"))]
        lowers = []
        for c in reversed(row.chain):
            r = self.db.layer(c)
            if r is None:
                raise SnapshotError(f"snapshot {key!r}: layer {c} is gone")
            lowers.append(self.layer_dir(r.id))
        if not lowers:
            lowers = [self.empty_dir]
        opts = _index_option() + [f"lowerdir={':'.join(lowers)}", f"upperdir={base}/fs", f"workdir={base}/work"]
        return [Mount("overlay", "overlay", tuple(opts))]

    async def remove(self, key: str) -> bool:
        """Delete the writable snapshot `key` (must be unmounted); False if it did not exist."""
        row = self.db.active(key)
        if row is None:
            return False
        base = self.active_path(row)
        if os.path.ismount(os.path.join(base, "fs")):
            raise SnapshotError(f"snapshot {key!r} is still mounted at {base}/fs")
        if os.path.exists(base):
            await asyncio.to_thread(shutil.rmtree, base)
        self.db.delete_active(key)
        return True

    def usage(self, key: str) -> Usage:
        """Bytes and inodes of the writable layer (the container's own changes)."""
        return disk_usage(self.upper_dir(key))

    def clean_tmp(self) -> None:
        """Remove abandoned unpack directories (call under the exclusive GC lock)."""
        for name in os.listdir(self.tmp_dir):
            shutil.rmtree(os.path.join(self.tmp_dir, name), ignore_errors=True)


# -- mounting -------------------------------------------------------------------------------------------------

def mount_all(mounts: list[Mount], target: str) -> None:
    """Mount `mounts` on `target` (an existing directory), as a shim would."""
    from runtime import mountopts
    for m in mounts:
        if m.type not in ("overlay", "bind"):
            raise SnapshotError(f"cannot mount type {m.type!r}")
        call = mountopts.mount_call(m.type, m.source, m.options)
        if call.data and len(call.data) >= PAGE_SIZE - 1:
            _mount_overlay_relative(m, target)
        else:
            mountopts.mount(call, target)


def _mount_overlay_relative(m: Mount, target: str) -> None:
    """Long lowerdir lists exceed the one-page limit of mount(2) data: mount from the layers' parent directory
    with relative paths, in a child process (chdir must not touch the daemon's working directory)."""
    opts = list(m.options)
    lower_i = next(i for i, o in enumerate(opts) if o.startswith("lowerdir="))
    lowers = opts[lower_i][len("lowerdir="):].split(":")
    common = os.path.commonpath(lowers)
    opts[lower_i] = "lowerdir=" + ":".join(os.path.relpath(p, common) for p in lowers)
    data = ",".join(opts)
    if len(data) >= PAGE_SIZE - 1:
        raise SnapshotError(f"overlay mount options for {target} are too long even with relative paths"
                            f" ({len(lowers)} layers)")
    p = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", data, os.path.abspath(target)], cwd=common,
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SnapshotError(f"mount overlay on {target}: {p.stderr.strip()}")


def unmount(target: str) -> None:
    from runtime.linux import syscalls
    try:
        syscalls.umount2(target, 0)
    except OSError as e:
        if e.errno == errno.EINVAL and not os.path.ismount(target):
            return  # not mounted
        if e.errno != errno.EBUSY:
            raise
        syscalls.umount2(target, syscalls.MNT_DETACH)


# -- plain-copy fallback --------------------------------------------------------------------------------------

def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _rm(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _copy_meta(src: str, dst: str, st: os.stat_result) -> None:
    os.lchown(dst, st.st_uid, st.st_gid)
    is_link = stat.S_ISLNK(st.st_mode)
    try:
        names = os.listxattr(src, follow_symlinks=False)
    except OSError:
        names = []
    for n in names:
        if n.startswith("trusted.overlay."):
            continue
        os.setxattr(dst, n, os.getxattr(src, n, follow_symlinks=False), follow_symlinks=False)
    if not is_link:
        os.chmod(dst, stat.S_IMODE(st.st_mode))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def _copy_layer(layer: str, dest: str) -> None:
    """Apply one unpacked layer (overlay form) on top of `dest`, as overlayfs would show it."""
    links: dict[tuple[int, int], str] = {}

    def walk(src_dir: str, dst_dir: str) -> None:
        with os.scandir(src_dir) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            s, d = e.path, os.path.join(dst_dir, e.name)
            st = e.stat(follow_symlinks=False)
            if _is_whiteout(st):
                _rm(d)
                continue
            if stat.S_ISDIR(st.st_mode):
                try:
                    opaque = os.getxattr(s, unpack.OPAQUE_XATTR, follow_symlinks=False) == b"y"
                except OSError:
                    opaque = False
                if opaque or (os.path.lexists(d) and not (os.path.isdir(d) and not os.path.islink(d))):
                    _rm(d)
                if not os.path.exists(d):
                    os.mkdir(d, 0o700)
                walk(s, d)
                _copy_meta(s, d, st)
                continue
            _rm(d)
            key = (st.st_dev, st.st_ino)
            if st.st_nlink > 1 and key in links:
                os.link(links[key], d, follow_symlinks=False)
                continue
            if stat.S_ISREG(st.st_mode):
                shutil.copyfile(s, d, follow_symlinks=False)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(s), d)
            elif stat.S_ISFIFO(st.st_mode):
                os.mkfifo(d, 0o600)
            else:
                os.mknod(d, stat.S_IFMT(st.st_mode) | 0o600, st.st_rdev)
            _copy_meta(s, d, st)
            if st.st_nlink > 1:
                links[key] = d

    try:
        root_opaque = os.getxattr(layer, unpack.OPAQUE_XATTR) == b"y"
    except OSError:
        root_opaque = False
    if root_opaque:
        for name in os.listdir(dest):
            _rm(os.path.join(dest, name))
    # The root directory keeps the snapshot's own attributes, as the overlay upper dir does.
    walk(layer, dest)
