"""runtime.mountopts: the one option table, and a containerd-style (type, source, options) mount turned into
mount(2) calls, as the shim (a task's rootfs) and husk-cri's snapshots make them."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtime import mountopts
from runtime.linux import syscalls as sc


@pytest.mark.parametrize("opts,flags,clear,data", [
    (["ro"], sc.MS_RDONLY, 0, []),
    (["ro", "rw"], 0, sc.MS_RDONLY, []),                                   # the later option wins
    (["nosuid", "nodev", "noexec"], sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC, 0, []),
    (["rbind"], sc.MS_BIND | sc.MS_REC, 0, []),
    (["strictatime", "mode=755", "size=1m"], sc.MS_STRICTATIME, 0, ["mode=755", "size=1m"]),
    (["defaults", "tmpcopyup", "idmap"], 0, 0, []),                        # no flag, and nothing as data
])
def test_option_table(opts: list[str], flags: int, clear: int, data: list[str]) -> None:
    mo = mountopts.parse_options(opts)
    assert (mo.flags, mo.clear, mo.data) == (flags, clear, data)


def test_known_lists_every_table() -> None:
    known = mountopts.known()
    assert {"ro", "rbind", "rprivate", "rro", "ridmap"} <= set(known) and "size=1m" not in known


def test_bind_applies_its_flags_by_a_remount() -> None:
    call = mountopts.mount_call("bind", "/src", ["rbind", "ro", "nosuid", "rprivate"])
    assert (call.source, call.fstype, call.flags, call.data) == ("/src", None, sc.MS_BIND | sc.MS_REC, None)
    assert call.remount == sc.MS_BIND | sc.MS_REMOUNT | sc.MS_RDONLY | sc.MS_NOSUID
    assert call.propagation == [sc.MS_PRIVATE | sc.MS_REC]
    # a "bind" option on another type binds too; a plain rw bind needs no remount
    call = mountopts.mount_call("none", "/src", ["bind", "rw"])
    assert call.flags == sc.MS_BIND and call.fstype is None and call.remount == 0


def test_filesystem_mount_keeps_flags_and_data_apart() -> None:
    call = mountopts.mount_call("overlay", "overlay", ("ro", "lowerdir=/l1:/l2", "upperdir=/u", "workdir=/w"))
    assert (call.fstype, call.flags, call.remount) == ("overlay", sc.MS_RDONLY, 0)
    assert call.data == "lowerdir=/l1:/l2,upperdir=/u,workdir=/w"
    assert mountopts.mount_call("tmpfs", "tmpfs", []).data is None


class _Recorder:
    def __init__(self, fail_at: int = -1) -> None:
        self.calls: list[tuple] = []
        self.fail_at = fail_at

    def mount(self, source, target, fstype, flags, data=None) -> None:  # type: ignore[no-untyped-def]
        self.calls.append(("mount", source, target, fstype, flags, data))
        if len(self.calls) - 1 == self.fail_at:
            raise OSError(22, "Invalid argument")

    def umount2(self, target, flags) -> None:  # type: ignore[no-untyped-def]
        self.calls.append(("umount2", target, flags))


def test_mount_is_all_or_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _Recorder(fail_at=1)
    monkeypatch.setattr(mountopts.sc, "mount", rec.mount)
    monkeypatch.setattr(mountopts.sc, "umount2", rec.umount2)
    with pytest.raises(OSError):
        mountopts.mount(mountopts.mount_call("bind", "/s", ["rbind", "ro"]), "/t")
    assert rec.calls[-1] == ("umount2", "/t", sc.MNT_DETACH)


def test_shim_rootfs_bind_keeps_nosuid(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # failed before: the shim's own table remounted a read-only bind with MS_RDONLY alone, dropping nosuid/nodev
    from shim import rootfs
    rec = _Recorder()
    monkeypatch.setattr(mountopts.sc, "mount", rec.mount)
    rootfs.mount_rootfs(str(tmp_path), [SimpleNamespace(type="bind", source="/snap", options=["rbind", "ro",
                                                                                              "nosuid", "nodev"])])
    target = str(tmp_path / "rootfs")
    assert rec.calls == [
        ("mount", "/snap", target, None, sc.MS_BIND | sc.MS_REC, None),
        ("mount", None, target, None, sc.MS_BIND | sc.MS_REMOUNT | sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV, None),
    ]


def test_snapshot_mounts_use_the_same_translation(monkeypatch: pytest.MonkeyPatch) -> None:
    from cri_server.images import snapshots
    from cri_server.images.snapshots import Mount
    rec = _Recorder()
    monkeypatch.setattr(mountopts.sc, "mount", rec.mount)
    snapshots.mount_all([Mount("overlay", "overlay", ("lowerdir=/l", "upperdir=/u", "workdir=/w")),
                         Mount("bind", "/fs", ("rbind", "ro"))], "/t")
    assert rec.calls == [
        ("mount", "overlay", "/t", "overlay", 0, "lowerdir=/l,upperdir=/u,workdir=/w"),
        ("mount", "/fs", "/t", None, sc.MS_BIND | sc.MS_REC, None),
        ("mount", None, "/t", None, sc.MS_BIND | sc.MS_REMOUNT | sc.MS_RDONLY, None),
    ]
    with pytest.raises(snapshots.SnapshotError, match="cannot mount type 'nfs'"):
        snapshots.mount_all([Mount("nfs", "h:/x", ())], "/t")
