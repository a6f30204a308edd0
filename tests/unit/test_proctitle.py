"""runtime/linux/proctitle.py in a child process (no root): comm, the command line in place, and the overflow into the
environment strings when the argv area is too short (husk-cri started as a bare `husk-cri`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = """
import ctypes, json, os, sys
sys.path.insert(0, os.environ["TOP"])
from runtime.linux.proctitle import set_title
set_title(os.environ["TITLE"])
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
with open("/proc/self/cmdline", "rb") as f:
    cmdline = f.read()
with open("/proc/self/comm") as f:
    comm = f.read().rstrip("\\n")
print(json.dumps({"comm": comm, "cmdline": cmdline.decode(), "pad": os.environ["PAD"],
                  "getenv": [(k, (libc.getenv(k.encode()) or b"").decode()) for k in ("TITLE", "PAD", "TOP")]}))
"""


def _run(title: str, argv: list[str]) -> dict:
    env = {"TOP": TOP, "TITLE": title, "PAD": "x" * 300, "CHILD": CHILD}
    r = subprocess.run(argv, executable=sys.executable, env=env, capture_output=True, text=True, check=True,
                       timeout=30)
    return json.loads(r.stdout)


def test_title_fits_in_place_as_arguments():
    got = _run("husk-shim abc", ["python3", "-c", "import os; exec(os.environ['CHILD'])", "x" * 40])
    assert got["comm"] == "husk-shim"
    assert got["cmdline"].rstrip("\0") == "husk-shim\0abc"


def test_long_title_overflows_into_the_environment_and_getenv_still_works():
    cid = "f" * 64
    got = _run(f"husk-shim {cid}", ["p", "-c", "import os;exec(os.environ['CHILD'])"])   # argv area: 36 bytes
    assert got["comm"] == "husk-shim"
    assert got["cmdline"] == f"husk-shim {cid}\0"             # one string, as setproctitle(3) leaves it
    assert dict(got["getenv"]) == {"TITLE": f"husk-shim {cid}", "PAD": "x" * 300, "TOP": TOP}
    assert got["pad"] == "x" * 300


def test_comm_is_cut_to_15_bytes():
    got = _run("husk-cri-spawner", ["python3", "-c", "import os; exec(os.environ['CHILD'])"])
    assert got["comm"] == "husk-cri-spawne"
    assert got["cmdline"].rstrip("\0") == "husk-cri-spawner"
