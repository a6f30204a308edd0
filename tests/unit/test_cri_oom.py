"""The oom_score_adj clamp for hosts without CAP_SYS_RESOURCE."""
from __future__ import annotations

import logging

from cri_server import oom


def test_auto_without_sys_resource_clamps_to_own_score():
    p = oom.detect("auto", read_score=lambda: 0, has_sys_resource=lambda: False)
    assert p.minimum == 0
    assert p.clamp(-998) == 0
    assert p.clamp(-1) == 0
    assert p.clamp(0) == 0
    assert p.clamp(500) == 500
    assert p.clamp(2000) == 1000


def test_auto_with_sys_resource_does_not_clamp():
    p = oom.detect("auto", read_score=lambda: 0, has_sys_resource=lambda: True)
    assert p.clamp(-998) == -998
    assert p.clamp(-5000) == -1000


def test_forced_modes():
    assert oom.detect("true", read_score=lambda: -100, has_sys_resource=lambda: True).clamp(-998) == -100
    assert oom.detect("false", read_score=lambda: 0, has_sys_resource=lambda: False).clamp(-998) == -998


def test_logged_once(caplog):
    p = oom.OomScorePolicy(minimum=7, reason="test")
    with caplog.at_level(logging.WARNING, logger="cri_server.oom"):
        p.clamp(-998, "a")
        p.clamp(-997, "b")
    assert len([r for r in caplog.records if "clamped" in r.getMessage()]) == 1


def test_detect_on_this_host_matches_the_bounding_set():
    with open("/proc/self/status") as f:
        capbnd = int(next(l for l in f if l.startswith("CapBnd:")).split()[1], 16)
        f.seek(0)
        capeff = int(next(l for l in f if l.startswith("CapEff:")).split()[1], 16)
    with open("/proc/self/oom_score_adj") as f:
        own = int(f.read())
    p = oom.detect("auto")
    if capbnd >> oom.CAP_SYS_RESOURCE & 1 and capeff >> oom.CAP_SYS_RESOURCE & 1:
        assert p.minimum == oom.OOM_SCORE_ADJ_MIN
    else:
        assert p.minimum == own
