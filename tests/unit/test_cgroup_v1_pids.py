"""V1Manager's pids.limit on a fake hierarchy (plain files in a temp dir): runc 1.1.5's fs driver leaves pids.max
alone for 0 and writes "max" for every negative value."""
from __future__ import annotations

from pathlib import Path

import pytest

from runtime.cgroups.v1 import V1Manager


@pytest.fixture
def pids_max(tmp_path: Path) -> tuple[V1Manager, Path]:
    m = V1Manager("/husk-unit/c")
    m._hier = {"pids": str(tmp_path)}          # the hierarchy's mount point, as hierarchies() would report it
    d = tmp_path / "husk-unit" / "c"
    d.mkdir(parents=True)
    (d / "pids.max").write_text("7")
    return m, d / "pids.max"


@pytest.mark.parametrize("limit,expected", [(0, "7"), (None, "7"), (12, "12"), (-1, "max"), (-5, "max")])
def test_pids_limit(pids_max, limit, expected) -> None:
    m, f = pids_max
    m.set({"pids": {"limit": limit}})
    assert f.read_text() == expected


def test_pids_without_a_limit_is_left_alone(pids_max) -> None:
    m, f = pids_max
    m.set({"pids": {}})
    m.set({"pids": None})
    assert f.read_text() == "7"
