"""The shim's OOM watcher on cgroup v2: woken by inotify on memory.events, and when the container's cgroup
vanishes before the exit is handled.

systemd removes a transient scope's cgroup as soon as its last process is gone, so under the systemd cgroup
driver the init's exit can be handled after memory.events is gone (seen in the node guest: a memory hog reported
"Error" instead of "OOMKilled" in 2 of 4 runs). The parent's hierarchical count tells the kill then.
"""
from __future__ import annotations

import select
import shutil
from pathlib import Path

import pytest

from runtime.cgroups.v2 import V2Manager
from shim import cgroup_watch


class FakeLoop:
    """The readers the watcher registers (shim.loop.Loop's interface); nothing polls on a timer any more."""

    def __init__(self) -> None:
        self.readers: dict = {}

    def add_reader(self, fd: int, cb) -> None:
        self.readers[fd] = cb

    def remove(self, fd: int) -> None:
        del self.readers[fd]


def _events(d: Path, oom_kill: int) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {oom_kill}\noom_group_kill 0\n")


@pytest.fixture
def tree(tmp_path, monkeypatch):
    root = tmp_path / "cgroup"
    pod = root / "kubepods.slice" / "kubepods-pod1.slice"
    scope = pod / "husk-c1.scope"
    _events(pod, 2)          # a sibling's earlier kills
    _events(scope, 0)
    (scope / "cgroup.procs").write_text("")
    return pod, scope


_watchers: list[cgroup_watch.OomWatcher] = []


@pytest.fixture(autouse=True)
def _close_watchers():
    yield
    while _watchers:
        _watchers.pop().close()


def _watch(scope: Path) -> tuple[cgroup_watch.OomWatcher, list[int]]:
    seen: list[int] = []
    root = next(p for p in scope.parents if p.name == "cgroup")
    w = cgroup_watch.OomWatcher(FakeLoop(), V2Manager("/" + str(scope.relative_to(root)), str(root)),
                                lambda: seen.append(1))
    _watchers.append(w)
    return w, seen


def test_a_kill_wakes_the_inotify_watch(tree):
    """No timer: the manager's inotify fd on memory.events is in the loop and reports the kill."""
    pod, scope = tree
    w, seen = _watch(scope)
    assert list(w.loop.readers) == [w.fd]
    _events(scope, 1)
    assert select.select([w.fd], [], [], 10)[0] == [w.fd]
    w.loop.readers[w.fd]()
    assert seen == [1] and w.fd >= 0                  # still watching: the cgroup is there
    assert select.select([w.fd], [], [], 0)[0] == []  # drained
    shutil.rmtree(scope)                              # IN_IGNORED: the watch ends with the cgroup
    assert select.select([w.fd], [], [], 10)[0] == [w.fd]
    w.loop.readers[w.fd]()
    assert w.fd == -1 and w.loop.readers == {} and seen == [1]


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


def test_top_level_cgroup_has_no_parent_fallback(tmp_path):
    root = tmp_path / "cgroup"
    _events(root / "c1", 0)
    w, seen = _watch(root / "c1")
    assert w.parent is None
    shutil.rmtree(root / "c1")
    assert not w.check() and seen == []
