"""Interoperability with containerd 1.6 (distro): it imports and unpacks what husk exports, and husk imports
what it exports, with the same image ids."""
from __future__ import annotations

import json
import os

import pytest

from cri_server.images import testimages
from cri_server.images.builder import LayerCache, write_image
from cri_server.images.service import ImageService
from tests.support.imagetest import run

pytestmark = [pytest.mark.e2e, pytest.mark.root]


@pytest.fixture(scope="module")
def layered_layout(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The layered test image with gzip layers only (containerd 1.6's ctr handles zstd too, but keep it simple)."""
    spec = next(s for s in testimages.catalog(big=False).images if s.name == "layered")
    return write_image(str(tmp_path_factory.mktemp("layouts")), spec, LayerCache()).layout


@pytest.mark.parametrize("fmt", ["oci", "docker"])
def test_containerd_imports_husk_exports(tmp_path, containerd, layered_layout, fmt):
    out = str(tmp_path / f"export-{fmt}.tar")

    async def export():  # type: ignore[no-untyped-def]
        svc = ImageService(str(tmp_path / "root"), None)
        try:
            (rec,) = await svc.import_archive(layered_layout, names=["docker.io/husk-test/layered:v1"])
            await svc.export([rec.id], out, fmt)
            return rec
        finally:
            await svc.close()
    rec = run(export())
    p = containerd.ctr("images", "import", out)
    assert p.returncode == 0, p.stderr
    ls = containerd.ctr("images", "ls")
    assert "docker.io/husk-test/layered:v1" in ls.stdout, ls.stdout
    # containerd unpacked it into its snapshotter and agrees on the config (image id)
    check = containerd.ctr("images", "check")
    assert "complete" in check.stdout, check.stdout
    snaps = containerd.ctr("snapshots", "ls")
    assert snaps.stdout.count("\n") >= 5, snaps.stdout  # header + one committed snapshot per layer
    # containerd's image has husk's config: the same image id
    man_digest = next(w for w in ls.stdout.split() if w.startswith("sha256:"))
    if fmt == "oci":
        assert man_digest == rec.manifest_digest
    man = json.loads(containerd.ctr("content", "get", man_digest).stdout)
    assert man["config"]["digest"] == rec.id


def test_husk_imports_containerd_exports(tmp_path, containerd, layered_layout):
    src = str(tmp_path / "src.tar")
    out = str(tmp_path / "ctr-export.tar")

    async def husk_export():  # type: ignore[no-untyped-def]
        svc = ImageService(str(tmp_path / "root"), None)
        try:
            (rec,) = await svc.import_archive(layered_layout, names=["docker.io/husk-test/layered:v1"])
            await svc.export([rec.id], src, "oci")
            return rec
        finally:
            await svc.close()
    rec = run(husk_export())
    assert containerd.ctr("images", "import", src).returncode == 0
    p = containerd.ctr("images", "export", out, "docker.io/husk-test/layered:v1")
    assert p.returncode == 0, p.stderr

    async def reimport():  # type: ignore[no-untyped-def]
        svc = ImageService(str(tmp_path / "root2"), None)
        try:
            return await svc.import_archive(out)
        finally:
            await svc.close()
    (back,) = run(reimport())
    assert back.id == rec.id and back.chain_ids == rec.chain_ids
    assert "docker.io/husk-test/layered:v1" in back.repo_tags
    assert os.path.getsize(out) > 1_000_000
