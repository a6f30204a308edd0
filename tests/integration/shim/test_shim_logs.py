"""The shim writes the CRI log itself: 100k lines on two streams, long lines, rotation in the middle (root)."""
from __future__ import annotations

import os
import re

import pytest

from shim.pb import google, husk as huskpb
from tests.shim_fixtures import cleanup_shim, lifecycle_runtimes, make_bundle, runtime_id, start_shim, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]
RECORD = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z (stdout|stderr) ([PF]) (.*)$")
N = 50_000          # per stream: 100k lines in all
LONG = 40_000       # every 1000th line is this long (split into 16 KiB P records)


def parse(paths):
    lines = {"stdout": [], "stderr": []}
    partial = {"stdout": b"", "stderr": b""}
    for path in paths:
        with open(path, "rb") as f:
            for raw in f.read().split(b"\n")[:-1]:
                m = RECORD.match(raw)
                assert m, raw[:120]
                stream, tag, text = m.group(1).decode(), m.group(2), m.group(3)
                partial[stream] += text
                if tag == b"F":
                    lines[stream].append(partial[stream])
                    partial[stream] = b""
    return lines, partial


@pytest.fixture(params=lifecycle_runtimes(), ids=runtime_id)
def shim(tmp_path, request):
    # the shim writes the log from the container's stdio pipes, which each runtime hands on its own way
    s = start_shim(str(tmp_path), request.param)
    yield s
    cleanup_shim(s)


def test_100k_lines_two_streams_with_rotation(tmp_path, shim):
    script = (f"L=$(head -c {LONG} /dev/zero | tr '\\0' x); i=0; "
              f"while [ $i -lt {N} ]; do "
              f"if [ $((i % 1000)) -eq 999 ]; then echo \"out $i $L\"; echo \"err $i $L\" >&2; "
              f"else echo \"out $i\"; echo \"err $i\" >&2; fi; i=$((i+1)); done; printf 'last-no-newline'")
    bundle = make_bundle(str(tmp_path), shim.cid, ["sh", "-c", script])
    log = str(tmp_path / "logs" / "c.log")
    opts = huskpb.CreateOptions(log_path=log)
    with shim.client() as c:
        c.Create(id=shim.cid, bundle=bundle, options=google.Any(type_url=opts.FULL_NAME, value=opts.encode()))
        c.Start(id=shim.cid)
        wait_for(lambda: os.path.exists(log) and os.path.getsize(log) > 1_000_000, 60, "log to grow")
        os.rename(log, log + ".1")
        c.ReopenLog(id=shim.cid)
        assert c.Wait(id=shim.cid, timeout=120).exit_status == 0
        c.Delete(id=shim.cid)
    assert os.path.getsize(log) > 0, "nothing written after the rotation"
    lines, partial = parse([log + ".1", log])
    long_tail = b" " + b"x" * LONG
    for stream, word in (("stdout", b"out"), ("stderr", b"err")):
        want = [word + b" %d" % i + (long_tail if i % 1000 == 999 else b"") for i in range(N)]
        got = lines[stream]
        assert len(got) == N, (stream, len(got))
        assert got == want, stream
    assert partial["stdout"] == b"last-no-newline" and partial["stderr"] == b""


def test_stdin_once_and_attach_with_cri_log(tmp_path, shim):
    """husk-cri's options: CRI log written by the shim, stdin through attach, closed when the client leaves."""
    from shim.attach import AttachClient
    bundle = make_bundle(str(tmp_path), shim.cid, ["sh", "-c", "cat; echo bye >&2"])
    log = str(tmp_path / "c.log")
    opts = huskpb.CreateOptions(log_path=log, stdin_once=True)
    with shim.client() as c:
        c.Create(id=shim.cid, bundle=bundle, stdin="attach:",
                 options=google.Any(type_url=opts.FULL_NAME, value=opts.encode()))
        a = AttachClient(c.AttachInfo(id=shim.cid).path)
        c.Start(id=shim.cid)
        a.write_stdin(b"hello\nworld")
        # the client sees the container's output too (fan-out next to the log)
        kind, data = a.read()
        assert data.startswith(b"hello")
        a.close()                                  # first client detaches: stdin closes, cat ends
        assert c.Wait(id=shim.cid, timeout=30).exit_status == 0
        c.Delete(id=shim.cid)
    lines, partial = parse([log])
    assert lines["stdout"] == [b"hello"] and partial["stdout"] == b"world"
    assert lines["stderr"] == [b"bye"]
