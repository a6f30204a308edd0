"""The shim's OOM watcher on cgroup v2 when the container's cgroup vanishes before the exit is handled.

systemd removes a transient scope's cgroup as soon as its last process is gone, so under the systemd cgroup
driver the init's exit can be handled after memory.events is gone (seen in the node guest: a memory hog reported
"Error" instead of "OOMKilled" in 2 of 4 runs). The parent's hierarchical count tells the kill then.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from shim import cgroup_watch


class FakeLoop:
    def __init__(self) -> None:
        self.timers: list = []

    def call_later(self, delay: float, fn) -> None:
        self.timers.append((delay, fn))


def _events(d: Path, oom_kill: int) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {oom_kill}\noom_group_kill 0\n")


@pytest.fixture
def tree(tmp_path, monkeypatch):
    root = tmp_path / "cgroup"
    monkeypatch.setattr(cgroup_watch, "CGROUP_ROOT", str(root))
    pod = root / "kubepods.slice" / "kubepods-pod1.slice"
    scope = pod / "husk-c1.scope"
    _events(pod, 2)          # a sibling's earlier kills
    _events(scope, 0)
    return pod, scope


def _watch(scope: Path) -> tuple[cgroup_watch.OomWatcher, list[int]]:
    seen: list[int] = []
    w = cgroup_watch.OomWatcher(FakeLoop(), cgroup_watch.CgroupPaths(v1={}, v2=str(scope)),
                                lambda: seen.append(1))
    return w, seen


def test_kill_seen_in_own_cgroup(tree):
    pod, scope = tree
    w, seen = _watch(scope)
    _events(scope, 1)
    _events(pod, 3)
    assert w.check() and seen == [1]
    assert not w.check()                   # counted once


def test_kill_after_the_scope_is_gone_is_read_from_the_parent(tree):
    pod, scope = tree
    w, seen = _watch(scope)
    _events(pod, 3)                        # the kill, counted up the hierarchy...
    shutil.rmtree(scope)                   # ...then systemd removed the emptied scope
    assert w.check() and seen == [1]


def test_scope_gone_without_a_kill_is_not_an_oom(tree):
    pod, scope = tree
    w, seen = _watch(scope)
    shutil.rmtree(scope)
    assert not w.check() and seen == []


def test_a_kill_already_counted_is_not_counted_again_from_the_parent(tree):
    pod, scope = tree
    w, seen = _watch(scope)
    _events(scope, 1)
    _events(pod, 3)
    assert w.check()
    shutil.rmtree(scope)
    assert not w.check() and seen == [1]


def test_top_level_cgroup_has_no_parent_fallback(tmp_path, monkeypatch):
    root = tmp_path / "cgroup"
    monkeypatch.setattr(cgroup_watch, "CGROUP_ROOT", str(root))
    _events(root / "c1", 0)
    w, seen = _watch(root / "c1")
    assert w.parent == ""
    shutil.rmtree(root / "c1")
    assert not w.check() and seen == []
