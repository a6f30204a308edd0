"""runtime.launcher: the generated `husk` sh script (skips site and the venv's .pth files, and execs the persistent
protected interpreter of runtime/exeguard.py when it is mounted)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from runtime import exeguard, launcher

TOP = Path(__file__).resolve().parents[2]


def test_launcher_render() -> None:
    text = launcher.render("/venv/bin/python", "/src", ["/venv/lib/site-packages", "/src"], "/usr/bin/python3.11",
                           "/run/p/x/bin/python")
    assert text.startswith("#!/bin/sh\n")
    assert "p=/run/p/x/bin/python\n" in text and '[ -x "$p" ] || p=/venv/bin/python\n' in text
    code = text.split("-c '", 1)[1].split("' \"$0\"", 1)[0]
    assert 'sys.path[0:0]=["/src"]' in code and 'sys.path.extend(["/venv/lib/site-packages"])' in code
    assert 'launch("/usr/bin/python3.11","/run/p/x/bin/python")' in code
    compile(code, "launcher", "exec")
    cp = subprocess.run(["sh", "-n"], input=text, text=True, capture_output=True)
    assert cp.returncode == 0, cp.stderr


def test_persistent_path_is_one_directory_per_interpreter() -> None:
    a = exeguard.persistent_path("/usr/bin/python3.11", "/run/x")
    assert a == "/run/x/usr%2Fbin%2Fpython3.11/bin/python"
    assert exeguard.persistent_path("/usr/bin%2Fpython3.11", "/run/x") != a


def test_launcher_runs_fast_path(tmp_path: Path) -> None:
    out = tmp_path / "husk"
    proot = tmp_path / "protected"
    subprocess.run([sys.executable, "-m", "runtime.launcher", str(out), str(proot)], check=True, cwd=TOP)
    assert out.read_text().startswith("#!/bin/sh\n")
    protected = exeguard.persistent_path(os.path.realpath(sys.executable), str(proot))
    try:
        cp = subprocess.run([str(out), "--root", str(tmp_path / "r"), "state", "nope"], capture_output=True,
                            text=True)
        assert cp.returncode == 1 and "does not exist" in cp.stderr
        cp = subprocess.run([str(out), "--help"], capture_output=True, text=True)
        assert cp.returncode == 0 and "runc" in cp.stdout and "Usage: husk " in cp.stdout
    finally:
        if os.geteuid() == 0:  # as root the first call made the persistent protected interpreter
            exeguard.remove_persistent(protected)
    assert not os.path.exists(os.path.dirname(os.path.dirname(protected)))
