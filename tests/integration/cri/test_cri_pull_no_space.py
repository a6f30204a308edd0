"""PullImage into a full disk (issue 19 item 2): husk-cri's root on a small tmpfs, an image bigger than it.

The pull answers RESOURCE_EXHAUSTED with a message naming what was written where (no INTERNAL, no traceback in
the log), leaves no partial download, unpack directory or layer behind, and a small pull into the same root
then succeeds (before the fix: INTERNAL with an OSError traceback, 17.5 MB of `.partial` files kept, and the next
pull failed as INVALID_ARGUMENT from tar's own ENOSPC)."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import grpc
import pytest

from cri_server.api.v1 import api_pb2 as pb
from cri_server.images.builder import ImageSpec, LayerCache, write_image
from cri_server.images.testimages import MIB, random_layer
from tests.integration.cri.conftest import BUSYBOX, SANDBOX_IMAGE
from tests.support.procfs import open_files_under
from tests.support.cri import CriDaemon
from tests.support.registry import LocalRegistry

pytestmark = [pytest.mark.root]

TMPFS_MB = 12
BIG_REF = "docker.io/husk-test/too-big:v1"  # docker.io maps to the local registry (registry_config_dir)


@pytest.fixture(scope="module")
def big_image(tmp_path_factory: pytest.TempPathFactory, cri_registry: LocalRegistry) -> str:
    """Three layers of 6 MiB of random data each (18 MiB to download, as much again unpacked)."""
    out = str(tmp_path_factory.mktemp("hct-too-big"))
    layers = [random_layer(40 + i, 0, 0, 1, 6 * MIB, f"big{i}") for i in range(3)]
    built = write_image(out, ImageSpec("too-big", [BIG_REF], layers, {"Cmd": ["sh"]}), LayerCache())
    cri_registry.push(built.layout, "husk-test/too-big:v1")
    return BIG_REF


@pytest.fixture
def small_root(tmp_path) -> Iterator[str]:
    """husk-cri's root directory on a tmpfs of TMPFS_MB MiB (CriDaemon.cleanup unmounts it; so does this)."""
    root = os.path.join(str(tmp_path), "root")
    os.makedirs(root)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m,mode=0711", "hct-nospace", root], check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", root], check=False, capture_output=True)


def _leftovers(images_root: str) -> list[str]:
    """Partial downloads, unpack directories and unfinished layers a failed pull could leave."""
    out = []
    ingest = os.path.join(images_root, "content", "ingest")
    out += [os.path.join(ingest, n) for n in os.listdir(ingest) if n.endswith(".partial")]
    tmp = os.path.join(images_root, "snapshots", "tmp")
    out += [os.path.join(tmp, n) for n in os.listdir(tmp)]
    layers = os.path.join(images_root, "snapshots", "layers")
    out += [os.path.join(layers, n) for n in os.listdir(layers)]
    return out


def test_pull_into_full_disk(tmp_path, pod_network, registry_config_dir, big_image, small_root):
    cri = CriDaemon(str(tmp_path), pod_network, registry_config_dir, SANDBOX_IMAGE)
    assert cri.root == small_root
    try:
        cri.start()
        im = cri.image_stub()
        with pytest.raises(grpc.RpcError) as e:
            im.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=big_image)), timeout=120)
        code, msg = e.value.code(), e.value.details()
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, msg)
        assert "no space left on device" in msg and small_root in msg, msg
        assert "bytes free" in msg, msg
        log = cri.log()
        assert "Traceback" not in log and "internal error" not in log, log[-3000:]

        images_root = os.path.join(small_root, "images")
        assert _leftovers(images_root) == []
        assert not im.ListImages(pb.ListImagesRequest()).images
        st = os.statvfs(small_root)
        assert st.f_bavail * st.f_frsize > (TMPFS_MB - 4) * MIB  # the space is back (meta.db, a few blobs)
        # no tar still writing into a removed directory (husk-cri keeps its databases open)
        assert open_files_under(small_root, ignore=("/meta.db", "/metadata.db")) == []

        # The next (small) pull into the same root works.
        ref = im.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120).image_ref
        assert ref.startswith("sha256:")
        assert [i.id for i in im.ListImages(pb.ListImagesRequest()).images] == [ref]
    finally:
        cri.cleanup()
