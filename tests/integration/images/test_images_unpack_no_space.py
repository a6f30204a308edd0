"""Unpacking a layer into a full filesystem (issue 19 item 2): NoSpace (RESOURCE_EXHAUSTED) from both appliers,
GNU tar's own ENOSPC included (before: InvalidLayer "tar exited with status 2 ... No space left on device")."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from cri_server.images import unpack
from cri_server.images.builder import Entry, compress, layer_tar
from cri_server.images.errors import NoSpace

pytestmark = pytest.mark.root


@pytest.fixture
def tiny_fs(tmp_path) -> Iterator[str]:
    d = str(tmp_path / "tiny")
    os.mkdir(d)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "husk-test-nospace", d], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", d], check=False)


@pytest.mark.parametrize("applier", ["gnutar", "tarfile"])
def test_unpack_into_full_fs_is_no_space(tmp_path, tiny_fs, applier):
    raw = layer_tar([Entry("big", "dir", 0o755), Entry("big/file", "file", 0o644, data=os.urandom(3 << 20))])
    blob, _mt = compress(raw, "gzip")
    path = str(tmp_path / "layer.gz")
    with open(path, "wb") as f:
        f.write(blob)
    dest = os.path.join(tiny_fs, "layer")
    os.mkdir(dest)
    with pytest.raises(NoSpace) as e:
        unpack.APPLIERS[applier](path, "auto", dest, "layer L")
    assert e.value.code == "RESOURCE_EXHAUSTED"
    assert "unpacking layer L" in str(e.value) and tiny_fs in str(e.value)
