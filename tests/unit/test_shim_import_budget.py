"""The shim's daemon path imports none of the heavy modules (memory per container; no root)."""
from __future__ import annotations

import os
import subprocess
import sys

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_daemon_path_import_budget():
    """The shim's daemon path must not import the heavy modules (memory per container)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]);"
            "import shim.daemon, shim.service, shim.events, shim.stdio, shim.cgroup_watch, shim.runtime_driver;"
            "print(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, TOP], capture_output=True, text=True,
                         check=True).stdout.split()
    banned = {"typing", "dataclasses", "logging", "json", "re", "threading", "asyncio", "inspect", "grpc",
              "google.protobuf", "subprocess", "argparse", "click", "shutil", "tempfile"}
    assert banned.isdisjoint(out), sorted(banned.intersection(out))
