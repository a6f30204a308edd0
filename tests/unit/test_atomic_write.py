"""runtime.fsutil.atomic_write: readers see the old file or the new one; fsync of the file and the directory
only as `durable` / `sync_dir` ask."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from runtime import fsutil


def _fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        seen.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)
    monkeypatch.setattr(fsutil.os, "fsync", fsync)
    return seen


@pytest.mark.parametrize("kw,expected", [
    ({}, ["file", "dir"]),
    ({"sync_dir": False}, ["file"]),
    ({"durable": False}, []),
])
def test_durability(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kw: dict, expected: list[str]) -> None:
    seen = _fsyncs(monkeypatch)
    target = tmp_path / "f"
    target.write_text("old")
    fsutil.atomic_write(str(target), "new", **kw)
    assert target.read_text() == "new" and seen == expected
    assert os.listdir(tmp_path) == ["f"]


def test_mode_is_exact_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        fsutil.atomic_write(str(tmp_path / "f"), b"x", mode=0o644, durable=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o644


def test_failure_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    target.write_text("old")

    def broken(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(fsutil.os, "replace", broken)
    with pytest.raises(OSError, match=f"write {target}: No space left on device"):
        fsutil.atomic_write(str(target), "new")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["f"]


def test_a_missing_directory_names_the_target(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"write {tmp_path}/no/f"):
        fsutil.atomic_write(str(tmp_path / "no" / "f"), "x")


def test_temporary_names_differ_within_one_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names: list[str] = []
    real = os.replace
    monkeypatch.setattr(fsutil.os, "replace", lambda a, b: (names.append(a), real(a, b)))
    for _ in range(3):
        fsutil.atomic_write(str(tmp_path / "f"), "x", durable=False)
    assert len(set(names)) == 3 and all(os.path.dirname(n) == str(tmp_path) for n in names)


def test_a_planted_link_at_the_temporary_name_is_not_written_through(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary name is guessable (pid + sequence): a hard link planted there was truncated and written
    (O_TRUNC), i.e. the linked file got the data. Now an existing name is skipped."""
    import itertools
    import os
    from runtime import fsutil
    victim = tmp_path / "victim"
    victim.write_text("keep")
    monkeypatch.setattr(fsutil, "_seq", itertools.count(7))
    os.link(victim, tmp_path / f".target.tmp-{os.getpid()}-7")
    fsutil.atomic_write(str(tmp_path / "target"), b"new")
    assert victim.read_text() == "keep"
    assert (tmp_path / "target").read_bytes() == b"new"
