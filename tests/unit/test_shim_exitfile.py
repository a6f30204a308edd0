"""shim.exitfile: exit records written atomically and read back, wait statuses mapped to exit codes."""
from __future__ import annotations

import os

from shim import exitfile


def test_exit_records(tmp_path):
    assert exitfile.read(str(tmp_path)) is None
    exitfile.write(str(tmp_path), "", exitfile.ExitRecord(5, 137, 1_700_000_000_000_000_001, True))
    exitfile.write(str(tmp_path), "e1", exitfile.ExitRecord(6, 0, 2))
    assert exitfile.read(str(tmp_path)) == exitfile.ExitRecord(5, 137, 1_700_000_000_000_000_001, True)
    assert exitfile.read(str(tmp_path), "e1").exit_status == 0
    (tmp_path / "exit-bad").write_text("garbage")
    assert exitfile.read(str(tmp_path), "bad") is None
    exitfile.remove(str(tmp_path), "e1")
    assert exitfile.read(str(tmp_path), "e1") is None
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_wait_status_mapping():
    assert exitfile.status_from_wait(3 << 8) == 3
    assert exitfile.status_from_wait(9) == 137
