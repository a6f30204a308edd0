"""Container root filesystems: the merged overlay view (and the plain-copy fallback) equals what umoci unpacks
from the same OCI layout; writes land in the container's own layer; usage and removal."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from cri_server.images import testimages
from cri_server.images.builder import Layer, LayerCache, write_image
from cri_server.images.errors import SnapshotExists, SnapshotNotFound
from cri_server.images.service import ImageService
from cri_server.images.snapshots import unmount
from tests.support.imagetest import run, tree

pytestmark = pytest.mark.root
LAYERED = "docker.io/husk-test/layered:v1"


@pytest.fixture
def mounts():
    """Targets mounted by a test; unmounted at the end whatever happened."""
    targets: list[str] = []
    yield targets
    for t in reversed(targets):
        if os.path.ismount(t):
            subprocess.run(["umount", "-l", t], check=False)


@pytest.fixture(scope="module")
def umoci_rootfs(tmp_path_factory):
    """umoci's unpack of the layered image. umoci 0.4 cannot read zstd layers, so it gets the same layers
    (same diff ids) all gzip-compressed."""
    d = tmp_path_factory.mktemp("husk-img-umoci")
    spec = next(s for s in testimages.catalog(big=False).images if s.name == "layered")
    spec.layers = [Layer(x.entries, "gzip") for x in spec.layers]
    built = write_image(str(d), spec, LayerCache())
    bundle = d / "bundle"
    subprocess.run(["umoci", "unpack", "--image", f"{built.layout}:latest", str(bundle)], check=True,
                   capture_output=True)
    return str(bundle / "rootfs")


@pytest.mark.parametrize("mode", ["overlay", "copy"])
def test_merged_view_equals_umoci(tmp_path, certs_dir, mounts, umoci_rootfs, mode):
    async def main():
        svc = ImageService(str(tmp_path / "root"), certs_dir, snapshot_mode=mode)
        try:
            rec = await svc.pull(LAYERED)
            ms = await svc.prepare_rootfs(rec.id, "ctr-1")
            assert ms[0].type == ("overlay" if mode == "overlay" else "bind")
            target = tmp_path / "rootfs"
            target.mkdir()
            svc.mount("ctr-1", str(target))
            mounts.append(str(target))
            got = tree(str(target))
            want = tree(umoci_rootfs)
            assert sorted(got) == sorted(want)
            diffs = {k: (got[k], want[k]) for k in got if got[k] != want[k]}
            assert not diffs
            # the whiteouts and the opaque directory did their job
            assert not (target / "data" / "gone").exists() and not (target / "bin" / "vi").exists()
            assert sorted(os.listdir(target / "data" / "opq")) == ["new1"]
            assert (target / "data" / "keep" / "a.txt").read_bytes() == b"version 2\n"
            # writes go to the container's own layer
            (target / "data" / "written").write_bytes(b"z" * 10000)
            os.unlink(target / "data" / "new.txt")
            u = svc.usage("ctr-1")
            assert u.bytes >= 10000 and u.inodes >= 3
            unmount(str(target))
            assert await svc.remove_snapshot("ctr-1")
            assert not await svc.remove_snapshot("ctr-1")
        finally:
            await svc.close()
    run(main())


def test_snapshots_are_isolated_and_keys_unique(tmp_path, certs_dir, mounts):
    async def main():
        svc = ImageService(str(tmp_path / "root"), certs_dir)
        try:
            rec = await svc.pull("busybox")
            await svc.prepare_rootfs("busybox", "a")
            await svc.prepare_rootfs(rec.id, "b")
            with pytest.raises(SnapshotExists):
                await svc.prepare_rootfs(rec.id, "a")
            ta, tb = tmp_path / "ta", tmp_path / "tb"
            ta.mkdir()
            tb.mkdir()
            svc.mount("a", str(ta))
            mounts.append(str(ta))
            svc.mount("b", str(tb))
            mounts.append(str(tb))
            (ta / "etc" / "only-in-a").write_text("a")
            os.unlink(ta / "bin" / "ls")
            assert not (tb / "etc" / "only-in-a").exists() and (tb / "bin" / "ls").exists()
            assert svc.usage("b").bytes < svc.usage("a").bytes
            assert sorted(svc.snapshot_keys()) == ["a", "b"]
            with pytest.raises(SnapshotNotFound):
                svc.usage("nope")
            for t in (ta, tb):
                unmount(str(t))
            assert await svc.remove_snapshot("a") and await svc.remove_snapshot("b")
        finally:
            await svc.close()
    run(main())


def test_image_removed_while_a_container_uses_it(tmp_path, certs_dir, mounts):
    """Removing an image keeps the layers a writable snapshot sits on; they go once the snapshot goes."""
    async def main():
        svc = ImageService(str(tmp_path / "root"), certs_dir)
        try:
            rec = await svc.pull(LAYERED)
            await svc.prepare_rootfs(rec.id, "c1")
            assert await svc.remove(rec.id)
            res = await svc.gc(wait=True)
            assert res.blobs >= 5 and res.layers == 0
            t = tmp_path / "t"
            t.mkdir()
            svc.mount("c1", str(t))
            mounts.append(str(t))
            assert (t / "etc" / "motd").read_text() == "husk layered test image\n"
            unmount(str(t))
            await svc.remove_snapshot("c1")
            res = await svc.gc(wait=True)
            assert res.layers == 4
            assert os.listdir(svc.snapshots.layers_dir) == []
            assert svc.content.list() == []
        finally:
            await svc.close()
    run(main())


def test_long_layer_chains_mount(tmp_path, mounts):
    """More lower directories than fit in one page of mount options still mount (relative paths)."""
    from cri_server.images.snapshots import Mount, mount_all
    base = tmp_path / ("x" * 200)
    lowers = []
    for i in range(40):
        d = base / f"layer-{i:03d}-{'y' * 60}"
        d.mkdir(parents=True)
        (d / f"f{i}").write_text(str(i))
        lowers.append(str(d))
    up, work, target = tmp_path / "up", tmp_path / "work", tmp_path / "merged"
    for d in (up, work, target):
        d.mkdir()
    m = Mount("overlay", "overlay", (f"lowerdir={':'.join(reversed(lowers))}", f"upperdir={up}", f"workdir={work}"))
    assert len(",".join(m.options)) > 4096
    mount_all([m], str(target))
    mounts.append(str(target))
    assert sorted(os.listdir(target)) == sorted(f"f{i}" for i in range(40))
    unmount(str(target))


def test_lost_layer_directory_is_unpacked_again(tmp_path, certs_dir, mounts):
    async def main():
        svc = ImageService(str(tmp_path / "root"), certs_dir)
        try:
            rec = await svc.pull("busybox")
            (row,) = svc.db.layers()
            shutil.rmtree(svc.snapshots.layer_dir(row.id))
            await svc.prepare_rootfs(rec.id, "k")
            (row2,) = svc.db.layers()
            assert row2.id != row.id and row2.state == "ready"
            t = tmp_path / "t"
            t.mkdir()
            svc.mount("k", str(t))
            mounts.append(str(t))
            assert (t / "bin" / "busybox").exists()
            unmount(str(t))
            await svc.remove_snapshot("k")
        finally:
            await svc.close()
    run(main())
