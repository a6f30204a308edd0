"""The drop-in tests' busybox image: a valid, reproducible OCI layout and archive (no root needed)."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from tests.e2e.dropin_image import DEFAULT_BUSYBOX, MT_LAYER, MT_MANIFEST, build_image

pytestmark = pytest.mark.skipif(shutil.which(DEFAULT_BUSYBOX) is None, reason="busybox-static not installed")


def _blob(layout: Path, digest: str) -> bytes:
    algo, hexd = digest.split(":")
    data = (layout / "blobs" / algo / hexd).read_bytes()
    assert hashlib.sha256(data).hexdigest() == hexd
    return data


def test_layout_is_consistent(tmp_path: Path) -> None:
    img = build_image(tmp_path, name="example.test/dropin/bb:v1", cmd=("sleep", "5"))
    index = json.loads((img.layout_dir / "index.json").read_text())
    desc = index["manifests"][0]
    assert desc["mediaType"] == MT_MANIFEST
    assert desc["annotations"]["io.containerd.image.name"] == "example.test/dropin/bb:v1"
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == "v1"
    manifest = json.loads(_blob(img.layout_dir, desc["digest"]))
    assert len(_blob(img.layout_dir, desc["digest"])) == desc["size"]
    config = json.loads(_blob(img.layout_dir, manifest["config"]["digest"]))
    assert config["config"]["Cmd"] == ["sleep", "5"]
    layer_desc = manifest["layers"][0]
    assert layer_desc["mediaType"] == MT_LAYER
    raw = gzip.decompress(_blob(img.layout_dir, layer_desc["digest"]))
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(raw).hexdigest()]
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["bin/busybox"].isfile() and members["bin/busybox"].mode & 0o111
    assert members["bin/sh"].issym() and members["bin/sh"].linkname == "../bin/busybox"
    assert members["tmp"].mode == 0o1777
    assert "etc/passwd" in members


def test_build_is_reproducible(tmp_path: Path) -> None:
    a = build_image(tmp_path / "a")
    b = build_image(tmp_path / "b")
    assert a.manifest_digest == b.manifest_digest
    assert a.archive.read_bytes() == b.archive.read_bytes()


def test_archive_holds_the_layout(tmp_path: Path) -> None:
    img = build_image(tmp_path)
    with tarfile.open(img.archive) as tar:
        names = set(tar.getnames())
    assert {"index.json", "oci-layout", "blobs/sha256/" + img.manifest_digest.split(":")[1]} <= names


def test_name_needs_a_tag(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="explicit :tag"):
        build_image(tmp_path, name="example.test:5000/dropin/bb")
