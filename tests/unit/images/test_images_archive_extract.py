"""archive._safe_extract: what `husk-cri images import` unpacks of a docker/OCI archive (regular files and
directories only, inside the destination), without tarfile's extraction filters (Python 3.11.4+; Debian 12's
interpreter, which the venv is built on, is 3.11.2: every import failed there with TypeError)."""
from __future__ import annotations

import io
import os
import stat
import tarfile

import pytest

from cri_server.images.archive import _safe_extract
from cri_server.images.errors import ArchiveError


def _tar(path, members):  # type: ignore[no-untyped-def]
    with tarfile.open(path, "w") as tf:
        for name, kind, data, mode in members:
            ti = tarfile.TarInfo(name)
            ti.mode = mode
            if kind == "dir":
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            elif kind == "file":
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
            else:
                ti.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                ti.linkname = data.decode()
                tf.addfile(ti)


def test_files_and_directories_are_extracted_with_plain_modes(tmp_path):
    arc, dest = tmp_path / "a.tar", tmp_path / "out"
    dest.mkdir()
    _tar(arc, [("blobs", "dir", b"", 0o777), ("blobs/sha256", "dir", b"", 0o700),
               ("blobs/sha256/ab", "file", b"layer", 0o4777), ("./index.json", "file", b"{}", 0o600),
               ("/abs/name", "file", b"x", 0o644), ("deep/er/file", "file", b"d", 0o644)])
    old = os.umask(0o077)   # the modes do not depend on the caller's umask
    try:
        _safe_extract(str(arc), str(dest))
    finally:
        os.umask(old)
    assert (dest / "blobs/sha256/ab").read_bytes() == b"layer"
    assert stat.S_IMODE(os.stat(dest / "blobs/sha256/ab").st_mode) == 0o644   # no set-uid, no exec
    assert stat.S_IMODE(os.stat(dest / "blobs/sha256").st_mode) == 0o755
    assert (dest / "index.json").read_bytes() == b"{}"
    assert (dest / "abs/name").read_bytes() == b"x"          # leading slash stripped, as filter="data" did
    assert (dest / "deep/er/file").read_bytes() == b"d"
    assert stat.S_IMODE(os.stat(dest / "deep/er").st_mode) == 0o755   # made for a file, not listed


def test_links_are_not_extracted(tmp_path):
    arc, dest = tmp_path / "a.tar", tmp_path / "out"
    dest.mkdir()
    _tar(arc, [("target", "file", b"t", 0o644), ("sym", "symlink", b"/etc/passwd", 0o777),
               ("hard", "hardlink", b"target", 0o644)])
    _safe_extract(str(arc), str(dest))
    assert sorted(os.listdir(dest)) == ["target"]


@pytest.mark.parametrize("name", ["../escape", "a/../../escape", "a/../.."])
def test_names_leaving_the_destination_are_refused(tmp_path, name):
    arc, dest = tmp_path / "a.tar", tmp_path / "d" / "out"
    dest.mkdir(parents=True)
    _tar(arc, [(name, "file", b"evil", 0o644)])
    with pytest.raises(ArchiveError, match="'..'") as e:
        _safe_extract(str(arc), str(dest))
    assert str(e.value).count(repr(name)) == 1   # the member named once
    assert not (tmp_path / "d" / "escape").exists() and not (tmp_path / "escape").exists()


def test_a_file_cannot_replace_a_directory(tmp_path):
    arc, dest = tmp_path / "a.tar", tmp_path / "out"
    dest.mkdir()
    _tar(arc, [("dir", "dir", b"", 0o755), ("dir/f", "file", b"1", 0o644), ("dir", "file", b"2", 0o644)])
    with pytest.raises(ArchiveError, match="'dir'"):
        _safe_extract(str(arc), str(dest))
    assert (dest / "dir/f").read_bytes() == b"1"


def test_not_a_tar_archive(tmp_path):
    arc = tmp_path / "a.tar"
    arc.write_bytes(b"no tar here" * 100)
    with pytest.raises(ArchiveError, match="not a readable tar archive"):
        _safe_extract(str(arc), str(tmp_path))
