"""Pulls into a full disk, in-process (issue 19 item 2): NoSpace (RESOURCE_EXHAUSTED) every time, no partial
download, unpack directory or tar process left (a sibling layer cancelled while it was already cleaning up used
to leave its tar writing into a removed directory, the space held until tar ended), then a small pull works."""
from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator

import pytest

from cri_server.images.builder import ImageSpec, LayerCache, write_image
from cri_server.images.errors import NoSpace
from cri_server.images.service import ImageService
from cri_server.images.testimages import MIB, random_layer
from tests.support.procfs import open_files_under
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def too_big(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry) -> str:
    out = str(tmp_path_factory.mktemp("husk-img-too-big"))
    layers = [random_layer(40 + i, 0, 0, 1, 6 * MIB, f"big{i}") for i in range(3)]
    built = write_image(out, ImageSpec("too-big", ["husk-test/too-big:v1"], layers, {"Cmd": ["sh"]}), LayerCache())
    registry.push(built.layout, "husk-test/too-big:v1")
    return "docker.io/husk-test/too-big:v1"


@pytest.fixture
def small_root(tmp_path) -> Iterator[str]:
    root = str(tmp_path / "root")
    os.makedirs(root)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "husk-test-nospace", root], check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", root], check=False)


def open_under(root: str) -> list[str]:
    """Files under `root` some process holds open, but SQLite's own (meta.db and its -wal/-shm)."""
    return open_files_under(root, ignore=("/meta.db",))


def test_pulls_into_full_disk_leave_nothing(small_root, certs_dir, too_big):
    async def main() -> None:
        svc = ImageService(small_root, certs_dir, retry_backoff=0.01)
        try:
            for _ in range(3):
                with pytest.raises(NoSpace) as e:
                    await svc.pull(too_big)
                assert e.value.code == "RESOURCE_EXHAUSTED" and small_root in str(e.value)
                assert open_under(small_root) == []
                ingest = svc.content.ingest_dir
                assert [n for n in os.listdir(ingest) if n.endswith(".partial")] == []
                assert os.listdir(svc.snapshots.tmp_dir) == [] and os.listdir(svc.snapshots.layers_dir) == []
                assert svc.list() == []
            rec = await svc.pull("busybox")
            assert svc.list() == [rec]
        finally:
            await svc.close()
    asyncio.run(main())
