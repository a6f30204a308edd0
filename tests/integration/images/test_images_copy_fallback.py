"""The automatic plain-copy fallback: with husk-cri's root on a filesystem overlayfs refuses as an upper dir (an
overlay mount itself, as on a node that runs inside a container), the probe fails, snapshots switch to plain
copies, and the container's root filesystem (a bind mount of the copy) shows what the overlay view shows
elsewhere."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from cri_server.images import snapshots
from cri_server.images.service import ImageService
from tests.support.imagetest import run, tree

pytestmark = pytest.mark.root


@pytest.fixture
def overlay_root(tmp_path):
    """A directory on an overlayfs mount (upper and lower on the test's tmp dir); unmounted at the end."""
    base = tmp_path / "ovl"
    for d in ("lower", "upper", "work", "merged"):
        (base / d).mkdir(parents=True)
    merged = str(base / "merged")
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={base}/lower,upperdir={base}/upper,workdir={base}/work", merged], check=True)
    mounted: list[str] = []
    try:
        yield merged, mounted
    finally:
        for t in reversed(mounted):
            if os.path.ismount(t):
                subprocess.run(["umount", "-l", t], check=False)
        shutil.rmtree(os.path.join(merged, "root"), ignore_errors=True)
        subprocess.run(["umount", "-l", merged], check=False)


async def _rootfs_tree(svc: ImageService, layout: str, target: str, mounted: list[str]) -> dict:  # type: ignore[type-arg]
    (rec,) = await svc.import_archive(layout, names=["docker.io/library/busybox:copy"])
    ms = await svc.prepare_rootfs(rec.id, "ctr-1")
    os.makedirs(target)
    svc.mount("ctr-1", target)
    mounted.append(target)
    try:
        return {"mounts": [m.type for m in ms], "tree": tree(target)}
    finally:
        svc.unmount(target)
        mounted.remove(target)
        assert await svc.remove_snapshot("ctr-1")


def test_overlay_unusable_switches_to_copies(tmp_path, overlay_root, test_images, caplog):
    merged, mounted = overlay_root
    layout = test_images["busybox"]

    async def main() -> tuple[dict, dict, str]:  # type: ignore[type-arg]
        on_overlay = ImageService(os.path.join(merged, "root"), None)          # snapshot_mode "auto"
        regular = ImageService(str(tmp_path / "regular"), None)
        try:
            copied = await _rootfs_tree(on_overlay, layout, str(tmp_path / "rootfs-copy"), mounted)
            overlaid = await _rootfs_tree(regular, layout, str(tmp_path / "rootfs-overlay"), mounted)
            return copied, overlaid, on_overlay.snapshots.mode
        finally:
            await on_overlay.close()
            await regular.close()

    with caplog.at_level("WARNING", logger=snapshots.log.name):
        copied, overlaid, mode = run(main())
    assert mode == snapshots.MODE_COPY
    assert copied["mounts"] == ["bind"] and overlaid["mounts"] == ["overlay"]
    assert copied["tree"] == overlaid["tree"] and "bin/busybox" in copied["tree"]
    warned = [r.getMessage() for r in caplog.records if "overlayfs unusable" in r.getMessage()]
    assert len(warned) == 1 and merged in warned[0] and "using plain copies" in warned[0]
    # The probe left nothing behind.
    tmp = os.path.join(merged, "root", "images", "snapshots", "tmp")
    assert not [n for n in os.listdir(tmp) if n.startswith("overlay-probe-")]
