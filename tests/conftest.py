"""Shared pytest settings: `root`-marked tests are skipped unless running as root; tests/node gets a longer
per-test timeout than the default of [tool.pytest.ini_options] (pytest-timeout)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# tests/node runs in the systemd guest under TCG: a test plus its module's husk-cri set-up (systemd unit, image
# import, pods) took up to ~60 s each and 643 s for 11 under load (scripts/vm/README.md); the guest itself is
# killed at 2400 s (scripts/vm-test). 1200 s still fails a hung test while leaving the rest of the run its time.
NODE_TIMEOUT = 1200.0
_NODE_DIR = Path(__file__).resolve().parent / "node"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(_NODE_DIR) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(NODE_TIMEOUT))
    if os.geteuid() == 0:
        return
    skip_root = pytest.mark.skip(reason="needs root")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip_root)
