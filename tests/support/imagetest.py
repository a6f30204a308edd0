"""Helpers shared by the image tests: run a coroutine, map registries with hosts.toml, snapshot a directory tree
for comparisons, hostile layer builders."""
from __future__ import annotations

import asyncio
import io
import os
import stat
import tarfile
from collections.abc import Coroutine
from typing import Any, TypeVar

from tests.support.registry import LocalRegistry, write_hosts_toml

T = TypeVar("T")
MIRRORED = ["docker.io", "registry.k8s.io", "gcr.io"]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def certs_for(tmp: str, reg: LocalRegistry) -> str:
    """A hosts.toml dir mapping the mirrored upstream names and the registry's own address to `reg` (http)."""
    d = os.path.join(tmp, "certs.d")
    for h in MIRRORED + [reg.addr]:
        write_hosts_toml(d, h, f"http://{reg.addr}")
    return d


def tree(root: str, with_dir_mtime: bool = False) -> dict[str, tuple[Any, ...]]:
    """Everything a container sees of a tree: type, mode, owner, size, content or link target, rdev, xattrs
    (overlay's own trusted.overlay.* excluded), mtimes of non-directories."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            xattrs = tuple(sorted((k, os.getxattr(p, k, follow_symlinks=False))
                                  for k in os.listxattr(p, follow_symlinks=False)
                                  if not k.startswith("trusted.overlay.") and not k.startswith("security.")))
            kind = stat.S_IFMT(st.st_mode)
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    body: Any = f.read()
            elif stat.S_ISLNK(st.st_mode):
                body = os.readlink(p)
            else:
                body = None
            mtime = st.st_mtime_ns if (with_dir_mtime or not stat.S_ISDIR(st.st_mode)) and \
                not stat.S_ISLNK(st.st_mode) else None
            out[rel] = (kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, body,
                        st.st_rdev if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else 0, xattrs, mtime)
    return out


def raw_tar(members: list[tuple[tarfile.TarInfo, bytes | None]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A tar stream from hand-made members (names are written exactly as given)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for ti, data in members:
            if data is not None:
                ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def member(name: str, kind: str = "file", data: bytes | None = b"x", link: str = "",
           pax: dict[str, str] | None = None) -> tuple[tarfile.TarInfo, bytes | None]:
    ti = tarfile.TarInfo(name)
    ti.mode = 0o644
    ti.mtime = 1700000000
    if kind == "dir":
        ti.type, ti.mode, data = tarfile.DIRTYPE, 0o755, None
    elif kind == "symlink":
        ti.type, ti.linkname, data = tarfile.SYMTYPE, link, None
    elif kind == "hardlink":
        ti.type, ti.linkname, data = tarfile.LNKTYPE, link, None
    if pax:
        ti.pax_headers = dict(pax)
    return ti, data
