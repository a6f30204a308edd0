"""Import and export: OCI layouts (directory, tar), docker-archive tars made by skopeo, round trips that skopeo
reads back; bad archives are clear errors."""
from __future__ import annotations

import json
import os
import subprocess
import tarfile

import pytest

from cri_server.images.errors import ArchiveError, ImageError
from cri_server.images.service import ImageService
from tests.support.imagetest import run

pytestmark = pytest.mark.root


def _skopeo(*args: str) -> str:
    p = subprocess.run(["skopeo", *args], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout


def _svc(tmp_path) -> ImageService:  # type: ignore[no-untyped-def]
    return ImageService(str(tmp_path / "root"), None)


def test_import_oci_layout_dir_with_base_name_and_pin(tmp_path, test_images):
    async def main():
        svc = _svc(tmp_path)
        try:
            recs = await svc.import_archive(test_images["layered"], base_name="docker.io/husk-test/layered")
            assert [r.repo_tags for r in recs] == [("docker.io/husk-test/layered:latest",)]
            assert svc.get("husk-test/layered") == recs[0]
            assert all(svc.snapshots.ready_layer(c) for c in recs[0].chain_ids)
            # a bare tag without a base name gives an untagged image, reachable by id
            svc2 = ImageService(str(tmp_path / "root2"), None)
            try:
                (r,) = await svc2.import_archive(test_images["pause"])
                assert r.repo_tags == () and svc2.get(r.id) == r
                r = svc2.set_pinned(r.id, True)
                assert r.pinned
            finally:
                await svc2.close()
        finally:
            await svc.close()
    run(main())


def test_import_skopeo_archives(tmp_path, test_images):
    oci_tar = str(tmp_path / "busybox-oci.tar")
    docker_tar = str(tmp_path / "busybox-docker.tar")
    layout = test_images["busybox"]
    _skopeo("copy", "--quiet", f"oci:{layout}:latest", f"oci-archive:{oci_tar}:docker.io/library/busybox:1.0")
    _skopeo("copy", "--quiet", f"oci:{layout}:latest", f"docker-archive:{docker_tar}:husk/busybox:dock")

    async def main():
        svc = _svc(tmp_path)
        try:
            (a,) = await svc.import_archive(oci_tar)
            assert a.repo_tags == ("docker.io/library/busybox:1.0",)
            (b,) = await svc.import_archive(docker_tar)
            assert "docker.io/husk/busybox:dock" in b.repo_tags
            assert a.id == b.id  # same config, same image
            assert len(svc.list()) == 1 and set(svc.get(a.id).repo_tags) == {  # type: ignore[union-attr]
                "docker.io/library/busybox:1.0", "docker.io/husk/busybox:dock"}
            (c,) = await svc.import_archive(docker_tar, names=["example.test/renamed:v9"])
            assert "example.test/renamed:v9" in c.repo_tags
        finally:
            await svc.close()
    run(main())


@pytest.mark.parametrize("fmt", ["oci", "oci-dir", "docker"])
def test_export_round_trip(tmp_path, test_images, fmt):
    out = str(tmp_path / f"export-{fmt}")

    async def main():
        svc = _svc(tmp_path)
        try:
            (rec,) = await svc.import_archive(test_images["layered"], names=["docker.io/husk-test/layered:v1"])
            await svc.export(["husk-test/layered:v1"], out, fmt)
            other = ImageService(str(tmp_path / "other"), None)
            try:
                (back,) = await other.import_archive(out)
                assert back.id == rec.id and back.repo_tags == rec.repo_tags
                assert back.chain_ids == rec.chain_ids
            finally:
                await other.close()
        finally:
            await svc.close()
    run(main())
    # skopeo reads what we wrote
    src = {"oci": f"oci-archive:{out}", "oci-dir": f"oci:{out}:v1", "docker": f"docker-archive:{out}"}[fmt]
    info = json.loads(_skopeo("inspect", src))
    assert len(info["Layers"]) == 4
    if fmt == "docker":
        with tarfile.open(out) as tf:
            manifest = json.load(tf.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert manifest[0]["RepoTags"] == ["husk-test/layered:v1"]


def test_bad_archives(tmp_path, test_images):
    empty = tmp_path / "empty"
    empty.mkdir()
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tf:
        ti = tarfile.TarInfo("../escape")
        ti.size = 1
        import io
        tf.addfile(ti, io.BytesIO(b"x"))
    broken = tmp_path / "broken"
    import shutil
    shutil.copytree(test_images["pause"], broken)
    blobs = broken / "blobs" / "sha256"
    victim = max(blobs.iterdir(), key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[:-1] + b"!")

    async def main():
        svc = _svc(tmp_path)
        try:
            with pytest.raises(ArchiveError, match="neither an OCI image layout"):
                await svc.import_archive(str(empty))
            with pytest.raises(ArchiveError):
                await svc.import_archive(str(evil))
            with pytest.raises(ImageError, match="digest mismatch|does not match"):
                await svc.import_archive(str(broken))
            with pytest.raises(ArchiveError, match="no such file"):
                await svc.import_archive(str(tmp_path / "missing.tar"))
            assert svc.list() == []
            assert not (tmp_path / "escape").exists()
        finally:
            await svc.close()
    run(main())
    assert not os.path.exists(tmp_path / "escape")


def test_build_pause_image_locally(tmp_path, test_images):
    async def main():
        svc = _svc(tmp_path)
        try:
            rec = await svc.build_pause_image("registry.k8s.io/pause:3.9-local")
            assert rec.pinned and rec.repo_tags == ("registry.k8s.io/pause:3.9-local",)
            assert rec.entrypoint == ("/pause", "-P") and rec.uid == 65535
            # the same image the test-image builder makes (reproducible digests)
            with open(os.path.join(test_images["pause"], "index.json")) as f:
                assert json.load(f)["manifests"][0]["digest"] == rec.manifest_digest
            with pytest.raises(ImageError, match="does not exist"):
                await svc.build_pause_image("x/pause:1", "/nonexistent/catatonit")
            assert os.listdir(os.path.join(svc.root, "tmp")) == []
        finally:
            await svc.close()
    run(main())
