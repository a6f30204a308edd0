"""runtime.rootfs.parse_options: config.json mount options parsed into flags, propagation, data and mount
attributes (the table itself: test_mountopts.py)."""
from __future__ import annotations

from runtime import rootfs
from runtime.linux import syscalls as sc


def test_parse_mount_options() -> None:
    mo = rootfs.parse_options(["nosuid", "noexec", "ro", "rw", "rbind", "rprivate", "mode=755", "size=1m", "rro"])
    assert mo.flags & sc.MS_NOSUID and mo.flags & sc.MS_NOEXEC and not mo.flags & sc.MS_RDONLY
    assert mo.flags & sc.MS_BIND and mo.flags & sc.MS_REC
    assert mo.propagation == [sc.MS_PRIVATE | sc.MS_REC]
    assert mo.data == ["mode=755", "size=1m"]
    assert mo.attr_set == sc.MOUNT_ATTR_RDONLY
