"""Replacing a file atomically: the one helper for the runtime, the shim and husk-cri.

A reader sees the old content or the new, never a partial file: the data goes to a temporary file in the same
directory, which is renamed over the target. With `durable` (the default) the file is fsync'd before the
rename and the directory after it, so a power loss keeps one of the two; callers whose files live on tmpfs
(/run) or may be rebuilt pass durable=False on purpose, for speed. sync_dir=False keeps the file's fsync (after
a power loss the file is whole, old or new) but not the directory's (~1.6 ms more on ext4 here): for files whose
rename may be lost with the boot. Imports only os (and errno, itertools: built in).
"""
from __future__ import annotations

import errno
import itertools
import os

_seq = itertools.count()  # next() is atomic under the GIL: threads of one process never share a temp name


def atomic_write(path: str, data: "bytes | str", *, mode: int = 0o644, durable: bool = True,
                 sync_dir: bool = True) -> None:
    """Replaces `path` with `data` (str is UTF-8) in a file of exactly `mode` (the umask does not apply).
    OSError names `path`; the temporary file is removed on any failure."""
    if isinstance(data, str):
        data = data.encode()
    head, base = os.path.split(path)
    # pid + sequence: unique among live writers. O_EXCL: never an existing file (a name left by a dead process
    # of the same pid, or a hard link planted in a directory others may write: truncating it would write
    # through the link); such a name is skipped for the next sequence number.
    for _ in range(64):
        tmp = os.path.join(head, f".{base}.tmp-{os.getpid()}-{next(_seq)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
            break
        except FileExistsError:
            continue
        except OSError as e:
            raise OSError(e.errno, f"write {path}: create {tmp}: {e.strerror}", path) from None
    else:
        raise OSError(errno.EEXIST, f"write {path}: no free temporary name next to it", path)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and e.filename is None:
            raise OSError(e.errno, f"write {path}: {e.strerror}", path) from None
        raise
    if durable and sync_dir:
        fsync_dir(head or ".")


def read_small(path: str) -> str:
    """The whole text of a small file (cgroup and /proc files) without Python's buffered-text stack (about a
    third of the cost of open().read() for a file of a few bytes); OSError as open() raises it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 65536)]
        while len(chunks[-1]) == 65536:
            chunks.append(os.read(fd, 65536))
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def fsync_dir(path: str) -> None:
    """Makes a rename or create in directory `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
