"""How the snapshotter picks overlay or plain copies: the overlayfs probe with mount(2) replaced (no root needed),
its cache, and "auto" following the probe while an explicit mode is never probed."""
from __future__ import annotations

import errno
import logging
import os

import pytest

from cri_server.images import snapshots
from cri_server.images.metadata import MetadataDB
from runtime.linux import syscalls


class FakeMount:
    def __init__(self, error: OSError | None) -> None:
        self.error = error
        self.calls: list[tuple[str, str]] = []
        self.unmounted: list[str] = []

    def mount(self, source, target, fstype, flags=0, data=None) -> None:  # type: ignore[no-untyped-def]
        self.calls.append((fstype, data))
        assert os.path.isdir(os.path.join(os.path.dirname(target), "upper"))
        if self.error is not None:
            raise self.error

    def umount2(self, target, flags=0) -> None:  # type: ignore[no-untyped-def]
        self.unmounted.append(target)


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch):
    """Install a fake mount(2) as root would see it; the probe cache starts empty and is restored."""
    def install(error: OSError | None) -> FakeMount:
        fake = FakeMount(error)
        monkeypatch.setattr(syscalls, "mount", fake.mount)
        monkeypatch.setattr(syscalls, "umount2", fake.umount2)
        monkeypatch.setattr(snapshots.os, "geteuid", lambda: 0)
        return fake
    monkeypatch.setattr(snapshots, "_overlay_probe", {})
    return install


def _has_overlay() -> bool:
    with open("/proc/filesystems") as f:
        return any(line.split()[-1] == "overlay" for line in f if line.strip())


needs_overlay_module = pytest.mark.skipif(not _has_overlay(), reason="this kernel lists no overlay filesystem")


@needs_overlay_module
def test_refused_overlay_mount_means_copies(tmp_path, probe, caplog):
    fake = probe(OSError(errno.EINVAL, "Invalid argument"))
    with caplog.at_level(logging.WARNING, logger=snapshots.log.name):
        assert snapshots.overlay_supported(str(tmp_path)) is False
    assert len(fake.calls) == 1 and fake.calls[0][0] == "overlay" and "upperdir=" in fake.calls[0][1]
    assert [r.getMessage() for r in caplog.records] == [
        f"overlayfs unusable under {tmp_path} ([Errno 22] Invalid argument): using plain copies for snapshots"]
    assert os.listdir(tmp_path) == []                      # the probe directory is gone
    assert snapshots.overlay_supported(str(tmp_path)) is False and len(fake.calls) == 1   # cached


@needs_overlay_module
def test_working_overlay_mount_means_overlay(tmp_path, probe):
    fake = probe(None)
    assert snapshots.overlay_supported(str(tmp_path)) is True
    assert len(fake.calls) == 1 and len(fake.unmounted) == 1 and os.listdir(tmp_path) == []


def test_without_root_there_is_no_overlay(tmp_path, probe, monkeypatch):
    fake = probe(None)
    monkeypatch.setattr(snapshots.os, "geteuid", lambda: 1000)
    assert snapshots.overlay_supported(str(tmp_path)) is False and fake.calls == []


@pytest.mark.parametrize("works,want", [(False, snapshots.MODE_COPY), (True, snapshots.MODE_OVERLAY)])
def test_auto_mode_follows_the_probe(tmp_path, monkeypatch, works, want):
    probed: list[str] = []
    monkeypatch.setattr(snapshots, "overlay_supported", lambda d: probed.append(d) or works)
    sn = snapshots.Snapshotter(str(tmp_path / "snap"), MetadataDB(str(tmp_path / "meta.db")))
    assert sn.mode == want and sn.mode == want
    assert probed == [sn.tmp_dir]                          # probed once, on the snapshots' own filesystem


@pytest.mark.parametrize("mode", [snapshots.MODE_OVERLAY, snapshots.MODE_COPY])
def test_explicit_mode_is_not_probed(tmp_path, monkeypatch, mode):
    monkeypatch.setattr(snapshots, "overlay_supported", lambda d: pytest.fail("probed"))
    sn = snapshots.Snapshotter(str(tmp_path / "snap"), MetadataDB(str(tmp_path / "meta.db")), mode)
    assert sn.mode == mode
