"""The ctypes layer: calls that need no privilege, and error reporting that names the object."""
from __future__ import annotations

import errno
import os

import pytest

from runtime.linux import syscalls


def test_capget_reports_64bit_masks() -> None:
    eff, perm, inh = syscalls.capget()
    with open("/proc/self/status") as f:
        status = dict(line.split(":\t", 1) for line in f if ":\t" in line)
    assert eff == int(status["CapEff"], 16)
    assert perm == int(status["CapPrm"], 16)
    assert inh == int(status["CapInh"], 16)


def test_last_cap_is_plausible() -> None:
    assert 36 <= syscalls.last_cap() < 64


def test_mount_error_names_target(tmp_path) -> None:
    target = tmp_path / "does-not-exist"
    with pytest.raises(OSError) as info:
        syscalls.mount("none", str(target), "tmpfs", 0, None)
    assert info.value.errno in (errno.ENOENT, errno.EPERM)
    assert str(target) in str(info.value)


def test_pidfd_open_self() -> None:
    fd = syscalls.pidfd_open(os.getpid())
    try:
        assert fd >= 0
    finally:
        os.close(fd)


def test_pidfd_open_missing_pid_raises() -> None:
    with pytest.raises(OSError) as info:
        syscalls.pidfd_open(2**22 + 12345)
    assert info.value.errno == errno.ESRCH
