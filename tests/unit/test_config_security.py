"""The security checks of config loading and the small helpers behind them, without root."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runtime import config
from runtime.errors import ConfigError


def _cfg(**process: object) -> dict:
    proc = {"cwd": "/", "args": ["sh"], "env": ["PATH=/bin"], "user": {"uid": 0, "gid": 0}}
    proc.update(process)
    return {"ociVersion": "1.2.0", "root": {"path": "rootfs"}, "process": proc,
            "linux": {"namespaces": [{"type": "mount"}]}}


def _bundle(tmp_path: Path, cfg: dict) -> Path:
    (tmp_path / "rootfs").mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def _error(fn, *args) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    return info.value


def test_env_beyond_execve_limits(tmp_path: Path) -> None:
    env = [f"RTIT_VARIABLE_{i:06d}=some-value-{i:06d}" for i in range(100_000)]
    err = _error(config.load, _bundle(tmp_path, _cfg(env=env)))
    assert err.path == "process.env" and "100000 variables" in err.reason


def test_stack_rlimit_raises_the_execve_limit(tmp_path: Path) -> None:
    env = [f"RTIT_VARIABLE_{i:06d}=some-value-{i:06d}" for i in range(100_000)]
    big = [{"type": "RLIMIT_STACK", "soft": 64 << 20, "hard": 64 << 20}]
    config.load(_bundle(tmp_path, _cfg(env=env, rlimits=big)))  # 6 MiB allowed with a 64 MiB stack


def test_one_string_over_128k(tmp_path: Path) -> None:
    err = _error(config.load, _bundle(tmp_path, _cfg(args=["sh", "-c", "x" * (128 << 10)])))
    assert err.path == "process.args[2]" and "at most" in err.reason


def test_nul_in_env(tmp_path: Path) -> None:
    err = _error(config.load, _bundle(tmp_path, _cfg(env=["PATH=/bin", "A=b\u0000c"])))
    assert err.path == "process.env[1]" and "NUL" in err.reason


def test_config_that_is_not_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "rootfs").mkdir()
    os.mkfifo(tmp_path / "config.json")
    err = _error(config.load, tmp_path)  # returns at once: the fifo is opened non-blocking
    assert "not a regular file" in err.reason


def test_config_size_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "MAX_CONFIG_BYTES", 1000)
    cfg = _cfg()
    cfg["annotations"] = {"pad": "x" * 2000}
    err = _error(config.load, _bundle(tmp_path, cfg))
    assert "limit of 1000" in err.reason


def test_deep_nesting(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    err = _error(config.load, tmp_path)
    assert "nested too deeply" in err.reason


def test_rootfs_through_a_symlink(tmp_path: Path) -> None:
    b = _bundle(tmp_path, _cfg())
    os.rename(b / "rootfs", b / "real")
    os.symlink("real", b / "rootfs")
    err = _error(config.load, b)
    assert err.path == "root.path" and "symlink" in err.reason


def test_selinux_label_refused(tmp_path: Path) -> None:
    err = _error(config.load, _bundle(tmp_path, _cfg(selinuxLabel="system_u:system_r:container_t:s0")))
    assert err.path == "process.selinuxLabel"


def test_notify_listener_only_with_a_notify_rule() -> None:
    from runtime.parent import notify_listener
    rule = {"names": ["mkdir"], "action": "SCMP_ACT_NOTIFY"}
    assert notify_listener({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/a", "syscalls": [rule]}) == "/a"
    assert notify_listener({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/a", "syscalls": []}) is None
    assert notify_listener(None) is None


def test_close_fds_keeps_only_what_is_asked() -> None:
    import subprocess
    import sys
    code = ("import os, sys; sys.path.insert(0, %r)\n"
            "from runtime.process import close_fds\n"
            "fds = [os.open('/dev/null', os.O_RDONLY) for _ in range(6)]\n"
            "close_fds(fds[0], keep=(fds[2], fds[4]))\n"
            "def alive(fd):\n"
            "    try:\n"
            "        os.fstat(fd)\n"
            "        return True\n"
            "    except OSError:\n"
            "        return False\n"
            "print([alive(fd) for fd in fds])\n"
            % str(Path(__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[False, False, True, False, True, False]"


def test_stage_interpreter_is_isolated() -> None:
    from runtime import exeguard
    argv = exeguard.python_argv()
    assert argv[1:3] == ["-I", "-S"]
