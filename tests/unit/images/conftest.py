"""Unit tests of the image subsystem: no root, no registry process; lookups other than loopback fail."""
from __future__ import annotations

import pytest

from tests.support.netguard import NetGuard


@pytest.fixture(autouse=True)
def netguard(monkeypatch: pytest.MonkeyPatch) -> NetGuard:
    g = NetGuard()
    g.install(monkeypatch)
    return g
