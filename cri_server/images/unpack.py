"""Applying one layer blob to an empty directory, in overlayfs form: whiteouts become 0/0 character devices and
opaque directories get `trusted.overlay.opaque=y`. Ownership, modes, xattrs, hard links and devices are kept.

Two appliers with the same rules (tarscan.LayerRules): GNU tar fed through the checking TarScanner (the default,
faster), and a pure-Python tarfile applier (fallback and test oracle). Blocking code: run it in a worker thread.
"""
from __future__ import annotations

import gzip
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from .errors import InvalidLayer, NoSpace, UnsafeLayer, is_no_space
from .tarscan import (
    BLK,
    CHR,
    DIR,
    FIFO,
    LNK,
    SYM,
    WHITEOUT_META_PREFIX,
    WHITEOUT_OPAQUE,
    WHITEOUT_PREFIX,
    LayerRules,
    TarScanner,
    clean_name,
)

log = logging.getLogger(__name__)

CHUNK = 1 << 20
OPAQUE_XATTR = "trusted.overlay.opaque"
# xattrs a layer may not set: they steer overlayfs itself (redirects, metacopy, opaque, whiteouts).
_FORBIDDEN_XATTR_PREFIX = "trusted.overlay."

GNU_TAR = shutil.which("tar") or "/usr/bin/tar"


class Cancelled(Exception):
    """The caller asked the applier to stop (the pull was cancelled)."""


@dataclass(frozen=True)
class ApplyResult:
    diff_id: str  # sha256 of the uncompressed stream
    uncompressed_size: int
    members: int
    whiteouts: int
    opaques: int


def _zstd_module():
    try:
        from compression import zstd  # type: ignore[import-not-found]  # Python 3.14+
    except ImportError:
        from backports import zstd  # type: ignore[import-not-found,no-redef]
    return zstd


class _Peeked:
    """A read-only stream with its first bytes already read (to sniff the compression of a pipe)."""

    def __init__(self, f: BinaryIO, head: bytes) -> None:
        self.f = f
        self.head = head

    def read(self, n: int = -1) -> bytes:
        if self.head:
            if n < 0 or n >= len(self.head):
                b, self.head = self.head, b""
                return b + (self.f.read(n - len(b)) if n > len(b) else self.f.read() if n < 0 else b"")
            b, self.head = self.head[:n], self.head[n:]
            return b
        return self.f.read(n)

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.f.close()


class _Stack:
    """A decompressing reader that also closes the stream under it (GzipFile and ZstdFile given a file object
    leave it open)."""

    def __init__(self, top: BinaryIO, bottom: BinaryIO) -> None:
        self.top = top
        self.bottom = bottom

    def read(self, n: int = -1) -> bytes:
        return self.top.read(n)

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        try:
            self.top.close()
        finally:
            if self.bottom is not self.top:
                self.bottom.close()

    def __enter__(self) -> _Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sniff_compression(head: bytes) -> str:
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head[:4] == b"\x28\xb5\x2f\xfd":
        return "zstd"
    return "none"


def open_decompressed(src: str | BinaryIO, compression: str) -> BinaryIO:
    """A file object over the uncompressed layer, from a path or a stream; `compression` is 'gzip', 'zstd',
    'none' or 'auto' (by magic number)."""
    f: BinaryIO = open(src, "rb") if isinstance(src, str) else src
    try:
        if compression == "auto":
            head = f.read(4)
            compression = sniff_compression(head)
            f = _Peeked(f, head)  # type: ignore[assignment]
        if compression == "gzip":
            return _Stack(gzip.GzipFile(fileobj=f, mode="rb"), f)  # type: ignore[return-value]
        if compression == "zstd":
            return _Stack(_zstd_module().ZstdFile(f, "rb"), f)  # type: ignore[return-value]
        if compression == "none":
            return _Stack(f, f)  # type: ignore[return-value]
    except BaseException:
        f.close()
        raise
    f.close()
    raise InvalidLayer(str(src), f"unknown compression {compression!r}")


def _chunks(f: BinaryIO, layer: str, cancel: threading.Event | None) -> Iterator[bytes]:
    while True:
        if cancel is not None and cancel.is_set():
            raise Cancelled(layer)
        try:
            b = f.read(CHUNK)
        except (OSError, EOFError, ValueError) as e:
            # gzip/zstd raise these for corrupt or truncated compressed data
            raise InvalidLayer(layer, f"cannot decompress: {e}") from None
        except Exception as e:  # zstd.ZstdError has no common base with the above
            if type(e).__name__ == "ZstdError":
                raise InvalidLayer(layer, f"cannot decompress: {e}") from None
            raise
        if not b:
            return
        yield b


def gnu_tar_command(dest: str) -> list[str]:
    return [GNU_TAR, "-x", "-f", "-", "-C", dest, "--numeric-owner", "--same-owner", "--same-permissions",
            "--xattrs", "--xattrs-include=*", "--no-acls", "--no-selinux", "--delay-directory-restore"]


def apply_gnutar(path: str | BinaryIO, compression: str, dest: str, layer: str,
                 cancel: threading.Event | None = None) -> ApplyResult:
    """Stream the layer (a blob path, or a stream of the blob) through TarScanner into `tar -x` in `dest` (an
    empty directory), then the whiteout pass."""
    rules = LayerRules(layer)

    def on_pax(name: str, pax: dict[str, bytes]) -> None:
        for k in pax:
            if k.startswith("SCHILY.xattr." + _FORBIDDEN_XATTR_PREFIX):
                raise UnsafeLayer(layer, name, f"sets overlayfs xattr {k[len('SCHILY.xattr.'):]!r}")

    scanner = TarScanner(rules, on_pax=on_pax)
    h = hashlib.sha256()
    total = 0
    with tempfile.TemporaryFile(prefix="husk-tar-err-") as errf, open_decompressed(path, compression) as src:
        proc = subprocess.Popen(gnu_tar_command(dest), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=errf, close_fds=True)
        assert proc.stdin is not None
        try:
            try:
                for chunk in _chunks(src, layer, cancel):
                    h.update(chunk)
                    total += len(chunk)
                    n = scanner.feed(chunk)
                    if n:
                        proc.stdin.write(chunk if n == len(chunk) else chunk[:n])
                scanner.finish()
                proc.stdin.close()
            except BrokenPipeError:
                pass  # tar died: its exit status and stderr say why
            rc = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if rc != 0:
            errf.seek(0)
            msg = errf.read(4000).decode(errors="replace").strip()
            if _tar_no_space(msg):
                raise NoSpace(f"unpacking {layer} (tar: {_first_line(msg)}; after {total} bytes of the layer's tar"
                              " stream)", dest)
            raise InvalidLayer(layer, f"tar exited with status {rc}: {msg}")
    try:
        whiteouts = convert_whiteouts(dest, rules)
    except OSError as e:
        if is_no_space(e):
            raise NoSpace(f"unpacking {layer} (whiteouts)", e.filename or dest) from None
        raise InvalidLayer(layer, f"whiteout conversion: {e}") from None
    return ApplyResult("sha256:" + h.hexdigest(), total, rules.members, whiteouts, len(rules.opaques))


# How GNU tar reports a full disk: strerror(ENOSPC or EDQUOT) (in this process's locale, and in C), or a short
# write ("Wrote only 5120 of 10240 bytes": write(2) returned less, which a regular file does only when full).
_NO_SPACE_MESSAGES = tuple({os.strerror(28), os.strerror(122), "No space left on device", "Disk quota exceeded",
                            "Wrote only "})


def _tar_no_space(stderr: str) -> bool:
    return any(m in stderr for m in _NO_SPACE_MESSAGES)


def _first_line(msg: str) -> str:
    return next((line for line in msg.splitlines() if any(m in line for m in _NO_SPACE_MESSAGES)),
                msg.splitlines()[0] if msg else "")


# -- the whiteout pass (GNU tar leaves `.wh.*` files; overlayfs wants devices and xattrs) ------------------

def _open_dir(root_fd: int, rel: str, layer: str) -> int:
    """Open `rel` under root_fd, refusing to follow any symlink on the way."""
    fd = os.dup(root_fd)
    for comp in [c for c in rel.split("/") if c]:
        try:
            nfd = os.open(comp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError as e:
            os.close(fd)
            raise UnsafeLayer(layer, rel, f"whiteout parent is not a plain directory ({e.strerror})") from None
        os.close(fd)
        fd = nfd
    return fd


def _keep_times(fd: int) -> Callable[[], None]:
    st = os.fstat(fd)

    def restore() -> None:
        os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
    return restore


def convert_whiteouts(dest: str, rules: LayerRules) -> int:
    """Turn the `.wh.` files recorded in `rules` into overlayfs whiteouts; returns how many were made."""
    made = 0
    if not (rules.whiteouts or rules.opaques):
        if rules.meta:
            _remove_meta(dest, rules)
        return 0
    root_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for wh in rules.whiteouts:
            parent, _, base = wh.rpartition("/")
            pfd = _open_dir(root_fd, parent, rules.layer)
            try:
                restore = _keep_times(pfd)
                try:
                    st = os.stat(base, dir_fd=pfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue  # a later member replaced it; nothing to convert
                if stat.S_ISDIR(st.st_mode):
                    raise InvalidLayer(rules.layer, f"whiteout {wh!r} is a directory")
                os.unlink(base, dir_fd=pfd)
                target = base[len(WHITEOUT_PREFIX):]
                try:
                    os.stat(target, dir_fd=pfd, follow_symlinks=False)
                    exists = True
                except FileNotFoundError:
                    exists = False
                # A whiteout hides lower layers only; a same-layer entry of that name wins (OCI image spec).
                if not exists:
                    os.mknod(target, stat.S_IFCHR, os.makedev(0, 0), dir_fd=pfd)
                    # the whiteout entry's own mtime, so unpacking is reproducible
                    os.utime(target, ns=(st.st_mtime_ns, st.st_mtime_ns), dir_fd=pfd, follow_symlinks=False)
                    made += 1
                restore()
            finally:
                os.close(pfd)
        for d in rules.opaques:
            pfd = _open_dir(root_fd, d, rules.layer)
            try:
                restore = _keep_times(pfd)
                try:
                    os.unlink(WHITEOUT_OPAQUE, dir_fd=pfd)
                except FileNotFoundError:
                    pass
                os.setxattr(pfd, OPAQUE_XATTR, b"y")
                restore()
            finally:
                os.close(pfd)
    finally:
        os.close(root_fd)
    if rules.meta:
        _remove_meta(dest, rules)
    return made


def _remove_meta(dest: str, rules: LayerRules) -> None:
    """Delete aufs bookkeeping entries (`.wh..wh.plnk` etc.): they must not show in the container."""
    root_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for m in rules.meta:
            parent, _, base = m.rpartition("/")
            if "/" + WHITEOUT_META_PREFIX in "/" + parent:
                continue  # inside a directory removed as a whole
            pfd = _open_dir(root_fd, parent, rules.layer)
            try:
                restore = _keep_times(pfd)
                try:
                    st = os.stat(base, dir_fd=pfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(base, dir_fd=pfd)
                else:
                    os.unlink(base, dir_fd=pfd)
                restore()
            finally:
                os.close(pfd)
    finally:
        os.close(root_fd)


# -- the tarfile applier ----------------------------------------------------------------------------------

class _HashingReader:
    def __init__(self, f: BinaryIO, layer: str, cancel: threading.Event | None) -> None:
        self.f = f
        self.h = hashlib.sha256()
        self.n = 0
        self.layer = layer
        self.cancel = cancel

    def read(self, size: int = -1) -> bytes:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled(self.layer)
        try:
            b = self.f.read(size)
        except (OSError, EOFError, ValueError) as e:
            raise InvalidLayer(self.layer, f"cannot decompress: {e}") from None
        self.h.update(b)
        self.n += len(b)
        return b

    def drain(self) -> None:
        while self.read(CHUNK):
            pass


_TYPE = {tarfile.REGTYPE: b"0", tarfile.AREGTYPE: b"0", tarfile.CONTTYPE: b"0", tarfile.LNKTYPE: LNK,
         tarfile.SYMTYPE: SYM, tarfile.CHRTYPE: CHR, tarfile.BLKTYPE: BLK, tarfile.DIRTYPE: DIR,
         tarfile.FIFOTYPE: FIFO}


def _remove_existing(path: str, keep_dir: bool) -> bool:
    """Make room for a new entry at `path`; returns True if a directory was kept."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        if keep_dir:
            return True
        os.rmdir(path)  # tar also refuses to replace a non-empty directory
        return False
    os.unlink(path)
    return False


def _xattrs(ti: tarfile.TarInfo, layer: str) -> list[tuple[str, bytes]]:
    out = []
    for k, v in ti.pax_headers.items():
        if k.startswith("SCHILY.xattr."):
            name = k[len("SCHILY.xattr."):]
            if name.startswith(_FORBIDDEN_XATTR_PREFIX):
                raise UnsafeLayer(layer, ti.name, f"sets overlayfs xattr {name!r}")
            out.append((name, v.encode("utf-8", "surrogateescape")))
    return out


def apply_tarfile(path: str | BinaryIO, compression: str, dest: str, layer: str,
                  cancel: threading.Event | None = None) -> ApplyResult:
    """The same result as apply_gnutar, extracting member by member in Python with whiteouts handled inline."""
    rules = LayerRules(layer)
    made = 0
    dirs: list[tuple[str, tarfile.TarInfo]] = []
    whiteouts: list[tuple[str, float]] = []
    with open_decompressed(path, compression) as raw:
        reader = _HashingReader(raw, layer, cancel)
        try:
            tf = tarfile.open(fileobj=reader, mode="r|", errorlevel=2)  # type: ignore[call-overload]
        except tarfile.TarError as e:
            raise InvalidLayer(layer, f"not a tar stream: {e}") from None
        try:
            for ti in _members(tf, layer):
                t = _TYPE.get(ti.type)
                if t is None:
                    raise InvalidLayer(layer, f"member {ti.name!r}: unsupported tar entry type {ti.type!r}")
                name = rules.check(ti.name, t, ti.linkname)
                target = os.path.join(dest, name) if name else dest
                base = name.rsplit("/", 1)[-1]
                if base == WHITEOUT_OPAQUE:
                    continue  # rules.opaques has it
                if base.startswith(WHITEOUT_PREFIX) and not base.startswith(WHITEOUT_META_PREFIX):
                    whiteouts.append((name, ti.mtime))
                    continue
                parent = os.path.dirname(target)
                if name and not os.path.isdir(parent):
                    os.makedirs(parent, 0o755, exist_ok=True)
                xattrs = _xattrs(ti, layer)
                if t == DIR:
                    if name and not _remove_existing(target, keep_dir=True):
                        os.mkdir(target, 0o700)
                    dirs.append((target, ti))
                    continue
                _remove_existing(target, keep_dir=False)
                if t == b"0":
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                    with os.fdopen(fd, "wb") as out:
                        fobj = tf.extractfile(ti)
                        assert fobj is not None
                        shutil.copyfileobj(fobj, out, CHUNK)
                elif t == SYM:
                    os.symlink(ti.linkname, target)
                elif t == LNK:
                    src = os.path.join(dest, clean_name(ti.linkname, layer, "hard link target"))
                    os.link(src, target, follow_symlinks=False)
                    continue  # a hard link shares the inode's metadata
                elif t in (CHR, BLK):
                    kind = stat.S_IFCHR if t == CHR else stat.S_IFBLK
                    os.mknod(target, kind | 0o600, os.makedev(ti.devmajor, ti.devminor))
                else:
                    os.mkfifo(target, 0o600)
                _set_meta(target, ti, xattrs, is_link=(t == SYM))
        except tarfile.TarError as e:
            raise InvalidLayer(layer, f"bad tar stream: {e}") from None
        except OSError as e:  # e.g. a file over a non-empty directory: tar fails on it too
            if is_no_space(e):
                raise NoSpace(f"unpacking {layer} member {ti.name!r} (after {reader.n} bytes of the layer's tar"
                              " stream)", e.filename or dest) from None
            raise InvalidLayer(layer, f"member {ti.name!r}: {e.strerror or e}") from None
        reader.drain()
    for name, mtime in whiteouts:
        parent, _, base = name.rpartition("/")
        real = os.path.join(dest, parent, base[len(WHITEOUT_PREFIX):])
        if not os.path.lexists(real):
            os.makedirs(os.path.dirname(real), 0o755, exist_ok=True)
            os.mknod(real, stat.S_IFCHR, os.makedev(0, 0))
            ns = int(mtime * 1_000_000_000)
            os.utime(real, ns=(ns, ns), follow_symlinks=False)
            made += 1
    for d in rules.opaques:
        os.setxattr(os.path.join(dest, d) if d else dest, OPAQUE_XATTR, b"y")
    if rules.meta:
        _remove_meta(dest, rules)
    # Directory metadata last, deepest first, so writing children does not disturb mtimes or modes.
    for target, ti in reversed(dirs):
        if rules.meta and not os.path.lexists(target):
            continue  # an aufs metadata directory, removed above
        _set_meta(target, ti, _xattrs(ti, layer), is_link=False)
    return ApplyResult("sha256:" + reader.h.hexdigest(), reader.n, rules.members, made, len(rules.opaques))


def _members(tf: tarfile.TarFile, layer: str) -> Iterator[tarfile.TarInfo]:
    while True:
        try:
            ti = tf.next()
        except tarfile.TarError as e:
            raise InvalidLayer(layer, f"bad tar stream: {e}") from None
        if ti is None:
            return
        yield ti


def _set_meta(path: str, ti: tarfile.TarInfo, xattrs: list[tuple[str, bytes]], is_link: bool) -> None:
    os.lchown(path, ti.uid, ti.gid)
    for k, v in xattrs:
        os.setxattr(path, k, v, follow_symlinks=False)
    if not is_link:
        os.chmod(path, ti.mode & 0o7777)
    mtime_ns = int(ti.mtime * 1_000_000_000)
    os.utime(path, ns=(mtime_ns, mtime_ns), follow_symlinks=False)


APPLIERS: dict[str, Callable[..., ApplyResult]] = {"gnutar": apply_gnutar, "tarfile": apply_tarfile}
