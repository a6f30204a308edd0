"""The CRI log writer: record format, 16 KiB splitting, partial lines, \\r\\n, reopen after rename."""
from __future__ import annotations

import os
import re

from shim.crilog import CriLogWriter, timestamp

RECORD = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z) (stdout|stderr) ([PF]) (.*)$")


def records(path):
    out = []
    with open(path, "rb") as f:
        for line in f.read().split(b"\n")[:-1]:
            m = RECORD.match(line)
            assert m, line[:100]
            out.append((m.group(2).decode(), m.group(3).decode(), m.group(4)))
    return out


def test_timestamp_format():
    assert timestamp(1_700_000_000_123_456_789) == "2023-11-14T22:13:20.123456789Z"
    assert timestamp(5) == "1970-01-01T00:00:00.000000005Z"


def test_lines_partial_and_crlf(tmp_path):
    p = tmp_path / "c.log"
    w = CriLogWriter(str(p))
    w.write("stdout", b"a\nb")
    w.write("stderr", b"x\r\n")
    w.write("stdout", b"c\n\n")
    w.flush_partial("stdout")           # nothing pending
    w.write("stdout", b"tail")
    w.close()
    assert records(p) == [("stdout", "F", b"a"), ("stderr", "F", b"x"), ("stdout", "F", b"bc"),
                          ("stdout", "F", b""), ("stdout", "P", b"tail")]


def test_long_lines_split(tmp_path):
    p = tmp_path / "c.log"
    w = CriLogWriter(str(p), max_line=10)
    w.write("stdout", b"0123456789" * 2 + b"abc\n")
    w.write("stdout", b"0123456789\n")   # exactly max: one F record
    w.close()
    assert records(p) == [("stdout", "P", b"0123456789"), ("stdout", "P", b"0123456789"),
                          ("stdout", "F", b"abc"), ("stdout", "F", b"0123456789")]


def test_reopen_after_rename(tmp_path):
    p = tmp_path / "c.log"
    w = CriLogWriter(str(p))
    w.write("stdout", b"one\n")
    os.rename(p, tmp_path / "c.log.1")
    w.write("stdout", b"two\n")        # still goes to the renamed file until reopen
    w.reopen()
    w.write("stdout", b"three\n")
    w.close()
    assert [r[2] for r in records(tmp_path / "c.log.1")] == [b"one", b"two"]
    assert [r[2] for r in records(p)] == [b"three"]
