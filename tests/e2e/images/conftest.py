"""Fixtures for image e2e tests: a private containerd; lookups other than loopback fail."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.containerd import Containerd
from tests.support.netguard import NetGuard


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
