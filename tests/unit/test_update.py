"""runc's update rules (runtime/update.py): flags, which fields change, 0 as "unchanged", the fix-ups."""
from __future__ import annotations

import pytest

from runtime import update as up
from runtime.errors import HuskError


@pytest.mark.parametrize("text, want", [
    ("512", 512), ("64m", 64 << 20), ("64M", 64 << 20), ("1g", 1 << 30), ("1GiB", 1 << 30), ("2kb", 2048),
    ("1.5g", 3 << 29), ("-1", -1), (" 100 k", 100 << 10),
])
def test_parse_bytes(text: str, want: int) -> None:
    assert up.parse_bytes(text, "memory") == want


@pytest.mark.parametrize("bad", ["abc", "1x", "", "-2", "m"])
def test_parse_bytes_rejects(bad: str) -> None:
    with pytest.raises(HuskError, match="--memory"):
        up.parse_bytes(bad, "memory")


def test_from_flags() -> None:
    got = up.from_flags({"memory": "64m", "memory_swap": "-1", "cpu_quota": "-1", "cpu_period": "100000",
                         "cpu_share": "512", "cpuset_cpus": "0-1", "pids_limit": "10", "blkio_weight": None,
                         "cpu_rt_runtime": "", "memory_reservation": None})
    assert got == {"memory": {"limit": 64 << 20, "swap": -1}, "cpu": {"quota": -1, "period": 100000,
                                                                    "shares": 512, "cpus": "0-1"},
                   "pids": {"limit": 10}}
    with pytest.raises(HuskError, match="--cpu-share"):
        up.from_flags({"cpu_share": "-5"})
    with pytest.raises(HuskError, match="--pids-limit"):
        up.from_flags({"pids_limit": "many"})


def test_changes_keeps_only_what_runc_updates() -> None:
    req = {"memory": {"limit": 100, "swap": 0, "swappiness": 10}, "cpu": {"shares": 0, "cpus": "", "quota": 5},
           "devices": [{"allow": True, "access": "rwm"}], "hugepageLimits": [], "pids": {"limit": 0},
           "unified": {"memory.high": "1000"}}
    change, ignored = up.changes(req)
    assert change == {"memory": {"limit": 100}, "cpu": {"quota": 5}, "unified": {"memory.high": "1000"}}
    assert ignored == ["memory.swappiness", "devices"]


def test_plan_merges_and_pairs() -> None:
    old = {"memory": {"limit": 100, "swap": 200}, "cpu": {"quota": 5, "period": 10}, "devices": [{"allow": False}]}
    apply, merged = up.plan(old, {"cpu": {"quota": 7}, "pids": {"limit": 9}})
    assert apply == {"cpu": {"quota": 7, "period": 10}, "pids": {"limit": 9}}
    assert merged == {"memory": {"limit": 100, "swap": 200}, "cpu": {"quota": 7, "period": 10},
                      "devices": [{"allow": False}], "pids": {"limit": 9}}
    assert old["cpu"]["quota"] == 5  # not modified
    apply, _ = up.plan(old, {"memory": {"swap": 300}})
    assert apply == {"memory": {"swap": 300, "limit": 100}}
    apply, merged = up.plan(old, {"memory": {"limit": -1}})
    assert apply == {"memory": {"limit": -1, "swap": -1}} and merged["memory"] == {"limit": -1, "swap": -1}
    apply, _ = up.plan({}, {"memory": {"limit": 50}})
    assert apply == {"memory": {"limit": 50}}
