"""--log/--log-format records have runc's shape for the same failures (containerd reads the last error record
of the JSON file; podman reads stderr)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

TEXT = re.compile(r'^time="[^"]+" level=(\w+) msg=(.*)$')


def failing_calls(rt, make_bundle) -> list[tuple[str, ...]]:
    bad = make_bundle(["/no/such/binary"])
    return [("create", "--bundle", str(bad), "rtit-logbad"), ("state", "rtit-nosuch"), ("kill", "rtit-nosuch", "9")]


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_log_file_records_like_runc(husk, runc, make_bundle, tmp_path: Path, fmt: str) -> None:
    seen = {}
    for name, rt in (("husk", husk), ("runc", runc)):
        log = tmp_path / f"{name}.{fmt}"
        out = []
        for call in failing_calls(rt, make_bundle):
            cp = rt("--log", str(log), "--log-format", fmt, *call, check=False)
            assert cp.returncode == 1, (name, call, cp.stderr)
            last = log.read_text().splitlines()[-1]
            if fmt == "json":
                rec = json.loads(last)
                assert list(rec) == ["level", "msg", "time"] and rec["level"] == "error", (name, last)
                msg = rec["msg"]
            else:
                m = TEXT.match(last)
                assert m and m.group(1) == "error", (name, last)
                msg = json.loads(m.group(2)) if m.group(2).startswith('"') else m.group(2)
            # with a log file, stderr gets the bare message
            assert cp.stderr.strip().splitlines()[-1] == msg, (name, cp.stderr)
            out.append(msg)
        seen[name] = out
    assert "/no/such/binary" in seen["husk"][0] and "/no/such/binary" in seen["runc"][0]
    assert "does not exist" in seen["husk"][1] and "does not exist" in seen["runc"][1]


def test_without_log_file_stderr_gets_the_record(husk, runc) -> None:
    for rt in (husk, runc):
        cp = rt("state", "rtit-nosuch", check=False)
        assert cp.returncode == 1
        m = TEXT.match(cp.stderr.strip())
        assert m and m.group(1) == "error" and "does not exist" in m.group(2), cp.stderr
        cp = rt("--log-format", "json", "state", "rtit-nosuch", check=False)
        rec = json.loads(cp.stderr)
        assert rec["level"] == "error" and "does not exist" in rec["msg"]
