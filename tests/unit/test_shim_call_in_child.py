"""shim.runtime_driver.call_in_child: work run in a forked child of the shim (Stats, the in-process runtime's
start), its bytes back over a pipe, so that the objects it touches are not copied into the shim's memory."""
from __future__ import annotations

import os

import pytest

from shim.runtime_driver import RuntimeFailure, call_in_child

_TOUCHED: list[int] = []


def _pid_and_touch() -> bytes:
    _TOUCHED.append(os.getpid())         # a write in the child's memory only
    return str(os.getpid()).encode()


def _none() -> None:
    return None


class ContainerNotFound(Exception):
    pass


def _missing(cid: str) -> bytes:
    raise ContainerNotFound(f"container {cid} does not exist")


def _dies() -> bytes:
    os._exit(7)


def _children() -> list[int]:
    me = os.getpid()
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if int(f.read().rpartition(")")[2].split()[1]) == me:
                        out.append(int(p))
            except (OSError, ValueError):
                pass
    return out


def test_runs_in_a_child_and_returns_its_bytes():
    before = _children()
    out = call_in_child("stats", "c1", _pid_and_touch)
    assert out.isdigit() and int(out) != os.getpid()
    assert _TOUCHED == []                 # the parent's list was not written
    assert _children() == before          # the child was reaped here
    assert call_in_child("start", "c1", _none) == b""
    big = call_in_child("stats", "c1", lambda: b"x" * 200_000)   # more than a pipe's buffer
    assert big == b"x" * 200_000


def test_an_exception_in_the_child_is_a_runtime_failure():
    with pytest.raises(RuntimeFailure) as e:
        call_in_child("start", "c2", _missing, "c2")
    assert e.value.not_found and e.value.op == "start" and "c2 does not exist" in e.value.message


def test_a_child_that_dies_is_a_runtime_failure():
    with pytest.raises(RuntimeFailure) as e:
        call_in_child("stats", "c3", _dies)
    assert not e.value.not_found and "status 7" in e.value.message
