"""The shim spawner (zygote) when husk-cri goes away mid-spawn (issue 19 item 5b): it ends quietly, exit status 0
and one log line, instead of a BrokenPipeError traceback on husk-cri's log."""
from __future__ import annotations

import os
import subprocess
import sys

# A fresh process (the spawner must start before any thread exists): start the zygote, send it a request and
# close the channel at once, as a husk-cri killed mid-spawn does. The zygote is still importing its modules when
# the channel closes (tens of ms), so it reads the queued request and then answers a peer that is gone.
HARNESS = r"""
import marshal, os, sys
sys.path.insert(0, sys.argv[1])
from shim.spawner import Spawner
sp = Spawner()
sp.start()
sp._sock.send(marshal.dumps({"cfg": {"id": "gone"}, "log_path": "", "debug": False}))
sp._sock.close()
sp._sock = None
_pid, status = os.waitpid(sp.pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_spawner_ends_quietly_when_husk_cri_goes_away_mid_spawn():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, "-c", HARNESS, root], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "0", (p.stdout, p.stderr)  # the zygote's own exit status
    assert "Traceback" not in p.stderr and "BrokenPipeError" not in p.stderr, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) <= 1, p.stderr
    assert not lines or "husk-cri went away" in lines[0], p.stderr


def test_spawner_ends_quietly_when_husk_cri_closes_the_channel():
    """The ordinary stop (no spawn in flight): no line at all."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    harness = HARNESS.replace("sp._sock.send(", "0 and sp._sock.send(")
    p = subprocess.run([sys.executable, "-c", harness, root], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "0" and p.stderr == "", (p.stdout, p.stderr)
