"""Fixtures for image e2e tests: a private containerd; lookups other than loopback fail."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from tests.support.containerd import Containerd  # noqa: E402
from tests.support.netguard import NetGuard  # noqa: E402


@pytest.fixture(autouse=True)
def netguard(monkeypatch: pytest.MonkeyPatch) -> NetGuard:
    g = NetGuard()
    g.install(monkeypatch)
    return g


@pytest.fixture
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    d = tmp_path_factory.mktemp("ctd")
    c = Containerd(str(d))
    c.start()
    try:
        yield c
    finally:
        c.stop()
