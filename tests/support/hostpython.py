"""Running the host's Python inside a busybox test container: read-only binds of its prefix and of the
directories of its shared libraries, so a probe written in Python can make raw syscalls from inside.

Test set-up only: the binds are read-only and the interpreter binary is reached through them by path.
"""
from __future__ import annotations

import os
import subprocess
import sys

INTERPRETER = os.path.realpath(sys.executable)


def interpreter_mounts() -> list[dict]:
    dirs = {sys.base_prefix, "/lib64"}
    out = subprocess.run(["ldd", INTERPRETER], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.split("=>")
        path = (parts[1] if len(parts) > 1 else parts[0]).split("(")[0].strip()
        if path.startswith("/"):
            dirs.add(os.path.dirname(os.path.realpath(path)))
            dirs.add(os.path.dirname(path))
    found = {d for d in dirs if os.path.isdir(d)}
    # a directory inside another bound one needs no mount of its own
    keep = sorted(d for d in found if not any(d != o and d.startswith(o.rstrip("/") + "/") for o in found))
    return [{"destination": d, "type": "bind", "source": d, "options": ["rbind", "ro", "nosuid", "nodev"]}
            for d in keep]


def argv(code: str) -> list[str]:
    """process.args that run `code` with the host interpreter (isolated, no site)."""
    return [INTERPRETER, "-I", "-S", "-c", code]
