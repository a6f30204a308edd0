"""runtime.cgroups.is_unified: a directory without cgroup.controllers is no cgroup2 root (no mountinfo scan)."""
from __future__ import annotations

from pathlib import Path

import pytest

from runtime import cgroups


def test_no_cgroup_controllers_means_no_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def scan(path: str) -> str:
        raise AssertionError(f"mountinfo scanned for {path}")
    monkeypatch.setattr(cgroups, "_mount_type", scan)
    assert cgroups.is_unified(str(tmp_path)) is False


def test_a_cgroup_controllers_file_alone_is_not_enough(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the mount table still decides: a stray file on a tmpfs does not make it a cgroup2 mount
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    seen = []
    monkeypatch.setattr(cgroups, "_mount_type", lambda path: seen.append(path) or "tmpfs")
    assert cgroups.is_unified(str(tmp_path)) is False and seen == [str(tmp_path)]
    monkeypatch.setattr(cgroups, "_mount_type", lambda path: "cgroup2")
    assert cgroups.is_unified(str(tmp_path)) is True
