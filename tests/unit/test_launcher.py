"""runtime.launcher: the generated `husk` launcher (skips site and the venv's .pth files): a script run directly by
the persistent protected interpreter of runtime/exeguard.py (#!), whose mount point is a runnable copy of the
interpreter until the first call as root mounts it; or, where a #! line cannot name it, an sh script."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    protected = exeguard.persistent_path(os.path.realpath(sys.executable), str(proot))
    assert out.read_text().startswith(f"#!{protected} -IS\n")
    real = os.stat(os.path.realpath(sys.executable))
    copy = os.stat(protected)   # before any call: a runnable copy, not the interpreter itself
    assert copy.st_size == real.st_size and copy.st_mode & 0o111 and copy.st_ino != real.st_ino
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


def test_render_direct_is_a_script_for_the_protected_interpreter() -> None:
    text = launcher.render("/venv/bin/python", "/src", ["/venv/lib/site-packages"], "/usr/bin/python3.11",
                           "/venv/husk-interpreter/x/bin/python", direct=True)
    first, rest = text.split("\n", 1)
    assert first == "#!/venv/husk-interpreter/x/bin/python -IS"
    assert 'launch("/usr/bin/python3.11","/venv/husk-interpreter/x/bin/python")' in rest
    compile(rest, "launcher", "exec")


def test_render_falls_back_to_sh_where_a_shebang_cannot_name_the_interpreter() -> None:
    for protected in ("/a dir/x/bin/python", "/" + "d" * 300 + "/bin/python"):
        text = launcher.render("/venv/bin/python", "/src", [], "/usr/bin/python3.11", protected, direct=True)
        assert text.startswith("#!/bin/sh\n"), protected


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting the protected interpreter needs root")
def test_launcher_works_before_and_after_the_mount_goes(tmp_path: Path) -> None:
    """A reboot leaves the launcher and the copy but no mount: the copy runs and the call mounts again."""
    from runtime.mountinfo import mount_at, read
    from runtime.linux import syscalls as sc
    out, proot = tmp_path / "husk", tmp_path / "protected"
    subprocess.run([sys.executable, "-m", "runtime.launcher", str(out), str(proot)], check=True, cwd=TOP)
    real = os.path.realpath(sys.executable)
    protected = exeguard.persistent_path(real, str(proot))
    state = [str(out), "--root", str(tmp_path / "r"), "state", "nope"]
    try:
        assert "does not exist" in subprocess.run(state, capture_output=True, text=True).stderr
        assert exeguard.persistent_ok(protected, real)
        for p in (protected, os.path.dirname(os.path.dirname(protected))):
            while mount_at(p, read()) is not None:
                sc.umount2(p, sc.MNT_DETACH)
        assert not exeguard.persistent_ok(protected, real)
        assert "does not exist" in subprocess.run(state, capture_output=True, text=True).stderr
        assert exeguard.persistent_ok(protected, real)
    finally:
        exeguard.remove_persistent(protected)


def test_launcher_falls_back_to_sh_when_the_copy_cannot_run(tmp_path: Path, monkeypatch) -> None:
    """A venv on a noexec mount, or an interpreter that finds libpython relative to its own path: the kernel
    would refuse the #! line, and husk could not run at all (not even to mount the interpreter)."""
    def broken_copy(real: str, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Path(path).write_bytes(b"\x7fELF not a program")
        os.chmod(path, 0o755)
    monkeypatch.setattr(exeguard, "prepare_persistent", broken_copy)
    out = tmp_path / "husk"
    launcher.write(str(out), str(tmp_path / "protected"))
    assert out.read_text().startswith("#!/bin/sh\n")


def test_a_rebuilt_interpreter_of_the_same_size_gets_a_new_copy(tmp_path: Path) -> None:
    real, path = tmp_path / "python", str(tmp_path / "root" / "x" / "bin" / "python")
    real.write_bytes(b"A" * 4096)
    real.chmod(0o755)
    exeguard.prepare_persistent(str(real), path)
    assert Path(path).read_bytes() == b"A" * 4096
    real.write_bytes(b"B" * 4096)                     # same size, new mtime
    os.utime(real, ns=(1, 10**18))
    exeguard.prepare_persistent(str(real), path)
    assert Path(path).read_bytes() == b"B" * 4096
    exeguard.prepare_persistent(str(real), path)      # unchanged: nothing to do
    assert exeguard.recorded_interpreter(path) == str(real)


def test_a_copy_that_fails_leaves_no_partial_file(tmp_path: Path, monkeypatch) -> None:
    import errno as errno_mod
    real, path = tmp_path / "python", tmp_path / "root" / "x" / "bin" / "python"
    real.write_bytes(b"A" * 4096)

    def full(*a: object) -> int:
        raise OSError(errno_mod.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "sendfile", full)
    with pytest.raises(OSError, match="No space"):
        exeguard.prepare_persistent(str(real), str(path))
    assert sorted(p.name for p in path.parent.iterdir()) == []
