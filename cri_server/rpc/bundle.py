"""The bundle of a sandbox's or a container's task: its directory with the image's snapshot mounted at rootfs/."""
from __future__ import annotations

import os
from typing import Any

from cri_server import fsutil
from cri_server.errors import image_failure
from cri_server.images.errors import ImageError


async def prepare_rootfs(images: Any, undo: Any, bundle: str, object_id: str, image_id: str, what: str) -> str:
    """Makes `bundle` (0711) and mounts `image_id`'s snapshot for `object_id` at <bundle>/rootfs, pushing the
    undo of each step; returns the rootfs path. A failure of the image store is `image_failure` naming `what`
    (RESOURCE_EXHAUSTED for a full disk)."""
    os.makedirs(bundle, mode=0o711, exist_ok=True)
    undo.push("remove the bundle", fsutil.remove_tree, bundle)
    rootfs = os.path.join(bundle, "rootfs")
    os.makedirs(rootfs, mode=0o711, exist_ok=True)
    try:
        await images.prepare_rootfs(image_id, object_id)
    except ImageError as e:
        raise image_failure(f"{what}: {e}", e) from None
    undo.push("remove the rootfs snapshot", images.remove_snapshot, object_id)
    images.mount(object_id, rootfs)
    undo.push("unmount the rootfs", fsutil.unmount_all, rootfs)
    return rootfs
