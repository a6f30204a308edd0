"""runtime/parent.py _fork_child: on cgroup v2 the intermediate child is cloned into its cgroup; everything that
stops that (no manager, a cgroup that cannot be opened, a refused clone3) falls back to a plain fork that the
runtime places afterwards. Nothing is really forked here: os.fork and the clone are stand-ins. No root."""
from __future__ import annotations

import errno
import os

import pytest

from runtime import parent
from runtime.linux import syscalls as sc


class _Mgr:
    version = 2

    def __init__(self, d: str) -> None:
        self.dir = d


@pytest.fixture
def calls(monkeypatch):
    seen: list = []
    monkeypatch.setattr(os, "fork", lambda: seen.append("fork") or 111)
    monkeypatch.setattr(sc, "clone3_usable", lambda: True)
    return seen


def test_no_manager_is_a_plain_fork(calls) -> None:
    assert parent._fork_child(None, "c") == (111, False)
    assert calls == ["fork"]


def test_a_v2_cgroup_is_entered_by_the_clone(calls, monkeypatch, tmp_path) -> None:
    fds: list[int] = []

    def clone(fd: int) -> int:
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path))   # the cgroup's directory
        fds.append(fd)
        return 222
    monkeypatch.setattr(sc, "fork_into_cgroup", clone)
    assert parent._fork_child(_Mgr(str(tmp_path)), "c") == (222, True)
    assert calls == []
    with pytest.raises(OSError):
        os.fstat(fds[0])                 # the directory fd is closed again


def test_a_refused_clone_falls_back_to_fork(calls, monkeypatch, tmp_path) -> None:
    def refused(fd: int) -> int:
        raise OSError(errno.EPERM, "Operation not permitted")
    monkeypatch.setattr(sc, "fork_into_cgroup", refused)
    assert parent._fork_child(_Mgr(str(tmp_path)), "c") == (111, False)
    assert calls == ["fork"]


def test_a_cgroup_that_cannot_be_opened_falls_back_to_fork(calls, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(sc, "fork_into_cgroup", lambda fd: pytest.fail("cloned without a cgroup"))
    assert parent._fork_child(_Mgr(str(tmp_path / "gone")), "c") == (111, False)
    assert calls == ["fork"]


def test_clone3_out_of_reach_is_a_plain_fork(calls, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(sc, "clone3_usable", lambda: False)
    monkeypatch.setattr(sc, "fork_into_cgroup", lambda fd: pytest.fail("clone3 called although unusable"))
    assert parent._fork_child(_Mgr(str(tmp_path)), "c") == (111, False)


@pytest.mark.parametrize("code,falls_back", [(errno.ENOSYS, True), (errno.E2BIG, True), (errno.EPERM, False)])
def test_the_inits_fork_falls_back_only_where_nothing_can_have_been_used_up(calls, monkeypatch, code,
                                                                          falls_back) -> None:
    """sc.fork_placed without any_refusal (child.fork_init, after unsharing a pid namespace): only ENOSYS and
    E2BIG fall back to a plain fork; any other refusal is raised."""
    def refused(fd: int) -> int:
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(sc, "fork_into_cgroup", refused)
    if falls_back:
        assert sc.fork_placed(5) == (111, False)
    else:
        with pytest.raises(OSError):
            sc.fork_placed(5)
        assert calls == []
