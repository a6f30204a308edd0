"""Cgroup path and device rules: linux.cgroupsPath resolved against husk's own cgroup, device cgroup v1 rules."""
from __future__ import annotations

import pytest

from runtime.cgroups import resolve_path
from runtime.cgroups.v1 import device_rule
from runtime.errors import ConfigError


def test_resolve_path_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.cgroups as cg
    monkeypatch.setattr(cg, "own_cgroup", lambda: "/parent")
    assert resolve_path("/abs/path", "id") == "/abs/path"
    assert resolve_path("rel/x", "id") == "/parent/rel/x"
    assert resolve_path(None, "id1") == "/parent/id1"
    assert resolve_path("", "id1") == "/parent/id1"
    with pytest.raises(ConfigError):
        resolve_path("system.slice:husk:id", "id")
    monkeypatch.setattr(cg, "own_cgroup", lambda: "/")
    assert resolve_path(None, "id1") == "/id1"


def test_device_rules() -> None:
    assert device_rule({"allow": False, "access": "rwm"}) == "a *:* rwm"
    assert device_rule({"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rw"}) == "c 1:3 rw"
    assert device_rule({"allow": True, "type": "b", "major": 8, "minor": -1}) == "b 8:* rwm"
