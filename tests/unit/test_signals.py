"""runtime.signals.parse: runc's kill syntax and CRI's / image StopSignal names, one parser for both."""
from __future__ import annotations

import signal

import pytest

from runtime import signals
from runtime.cli import parse_signal
from runtime.errors import HuskError


@pytest.mark.parametrize("name,num", [
    # runc kill
    ("KILL", 9), ("SIGKILL", 9), ("kill", 9), ("9", 9), ("64", 64), ("SIGUSR1", signal.SIGUSR1), ("hup", 1),
    # CRI's Signal enum, image StopSignal and the config file
    ("SIGTERM", 15), ("TERM", 15), (" SIGTERM ", 15), ("SIGRTMIN", signal.SIGRTMIN),
    ("SIGRTMINPLUS3", signal.SIGRTMIN + 3), ("SIGRTMIN+1", signal.SIGRTMIN + 1), ("RTMAX-2", signal.SIGRTMAX - 2),
    ("SIGRTMAXMINUS1", signal.SIGRTMAX - 1), ("SIGRTMAX", signal.SIGRTMAX), ("SIGCLD", signal.SIGCHLD),
    ("SIGIOT", signal.SIGABRT),
])
def test_signal_names(name: str, num: int) -> None:
    assert signals.parse(name) == num


@pytest.mark.parametrize("bad", ["", "SIGNOPE", "0", "65", "999", "-9", "SIGRTMAXPLUS1", "SIGRTMIN-1",
                                 "SIGRTMINPLUS", "RTMINX", "٩"])
def test_bad_signal_names(bad: str) -> None:
    with pytest.raises(ValueError):
        signals.parse(bad)


def test_cli_reports_a_bad_signal_as_a_runtime_error() -> None:
    assert parse_signal("SIGRTMIN+2") == signal.SIGRTMIN + 2   # runc's CLI took no realtime offsets before
    with pytest.raises(HuskError, match="unknown signal 'NOPE'"):
        parse_signal("NOPE")
    with pytest.raises(HuskError, match="out of range"):
        parse_signal("65")
