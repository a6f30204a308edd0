"""A failure in create's forked intermediate child before it reaches the child's own error handling (here
child.run itself raising) must end that child: it must neither unwind into the caller (whose Undo would remove
the state dir and cgroup the parent still owns, and which would then go on as a second copy of the caller) nor
leave the parent with "[Errno 32] Broken pipe" instead of the reason."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.conftest import unique

pytestmark = pytest.mark.root

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

_CODE = """
import json, os, sys
from runtime import child, lifecycle
def boom(ctx, chan, reentered=False):
    raise RuntimeError("boom in the child")
child.run = boom
me = os.getpid()
try:
    lifecycle.create(sys.argv[1], sys.argv[2], sys.argv[3])
    out = {"pid": os.getpid(), "ok": True}
except Exception as e:
    out = {"pid": os.getpid(), "error": str(e)}
print(json.dumps(out), flush=True)
"""


def test_a_failing_child_exits_and_the_parent_reports_why(tmp_path, make_bundle) -> None:
    root = tmp_path / "root"
    cid = unique()
    bundle = make_bundle(["true"])
    r = subprocess.run([sys.executable, "-c", _CODE, str(root), cid, str(bundle)], capture_output=True,
                       text=True, cwd=TOP, timeout=60, stdin=subprocess.DEVNULL)
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == 1, r.stdout + r.stderr        # one caller went on, not two
    got = lines[0]
    assert "error" in got, got
    assert "boom in the child" in got["error"], got
    assert "Broken pipe" not in got["error"]
    assert not (root / cid).exists()                    # undone once, by the parent
