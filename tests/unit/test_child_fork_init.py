"""child.fork_init: the init forked straight into its cgroup2 cgroup (clone3 CLONE_INTO_CGROUP), a plain fork plus
a write to cgroup.procs where the kernel does not know clone3, and an error (nothing forked) otherwise: a failed
clone3 may have spent a new pid namespace's pid 1, after which that namespace forks nothing more."""
from __future__ import annotations

import errno
import os

import pytest

from runtime import child
from runtime.errors import SetupError
from runtime.linux import syscalls as sc


def _refuse(err: int):
    def fork_into_cgroup(fd: int) -> int:
        raise OSError(err, os.strerror(err))
    return fork_into_cgroup


@pytest.mark.parametrize("err", [errno.ENOSYS, errno.E2BIG])
def test_unknown_clone3_falls_back_to_fork_and_cgroup_procs(tmp_path, monkeypatch, err) -> None:
    (tmp_path / "cgroup.procs").write_text("")   # stands in for the cgroup2 directory's file
    monkeypatch.setattr(sc, "_clone3_ok", True)
    monkeypatch.setattr(sc, "fork_into_cgroup", _refuse(err))
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    pid = child.fork_init(fd)
    if pid == 0:
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (tmp_path / "cgroup.procs").read_text() == str(pid)
    with pytest.raises(OSError):
        os.fstat(fd)   # fork_init closed it


def test_other_clone3_failures_are_errors_and_fork_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sc, "_clone3_ok", True)
    monkeypatch.setattr(sc, "fork_into_cgroup", _refuse(errno.EACCES))
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked after a failed clone3"))
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with pytest.raises(SetupError, match="fork the init into its cgroup2 cgroup: Permission denied"):
            child.fork_init(fd)
    finally:
        os.close(fd)


def test_without_a_cgroup2_directory_it_is_a_plain_fork(monkeypatch) -> None:
    monkeypatch.setattr(sc, "fork_into_cgroup", lambda fd: pytest.fail("clone3 without a cgroup fd"))
    pid = child.fork_init(-1)
    if pid == 0:
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_clone3_that_a_seccomp_filter_refuses_is_not_tried(tmp_path, monkeypatch) -> None:
    """A filter that answers EPERM for clone3 (older container profiles, systemd SystemCallFilter=): the probe
    says no and the create forks as before instead of failing."""
    (tmp_path / "cgroup.procs").write_text("")
    monkeypatch.setattr(sc, "_clone3_ok", None)
    real = sc._libc.syscall

    def syscall(number, *args):   # what the filter does to clone3
        if number == sc.SYS_clone3:
            import ctypes
            ctypes.set_errno(errno.EPERM)
            return -1
        return real(number, *args)
    monkeypatch.setattr(sc._libc, "syscall", syscall)
    monkeypatch.setattr(sc, "fork_into_cgroup", lambda fd: pytest.fail("clone3 tried after the probe said no"))
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    pid = child.fork_init(fd)
    if pid == 0:
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (tmp_path / "cgroup.procs").read_text() == str(pid) and sc.clone3_usable() is False
