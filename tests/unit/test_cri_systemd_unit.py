"""husk-cri as a systemd service: the unit `husk-cri setup --systemd-unit` writes (and contrib/systemd's copy),
and the READY=1 notification a Type=notify unit waits for."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cri_server import nodesetup, sdnotify
from cri_server.cli import main

REPO = Path(__file__).resolve().parents[2]
CONTRIB_UNIT = REPO / "contrib" / "systemd" / "husk-cri.service"


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd's unit syntax as INI: sections of keys, a key may repeat (ExecStartPre)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = out.setdefault(line[1:-1], {})
            continue
        assert section is not None and "=" in line, line
        key, _, value = line.partition("=")
        section.setdefault(key.strip(), []).append(value.strip())
    return out


def one(unit: dict, section: str, key: str) -> str:
    values = unit[section][key]
    assert len(values) == 1, (key, values)
    return values[0]


class Systemctl:
    """Records systemctl calls (the subprocess.run seam of install_unit)."""

    def __init__(self, returncode: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.returncode = returncode

    def __call__(self, argv, **kw):
        self.calls.append(list(argv))
        return subprocess.CompletedProcess(argv, self.returncode, "", "Failed to connect to bus")


def test_unit_keys():
    unit = parse_unit(nodesetup.unit_text(["/opt/husk/.venv/bin/husk-cri"]))
    assert one(unit, "Service", "ExecStart") == "/opt/husk/.venv/bin/husk-cri"
    assert one(unit, "Service", "Type") == "notify"          # husk-cri sends READY=1 (sdnotify)
    assert one(unit, "Service", "KillMode") == "process"     # shims and containers outlive a stop
    assert one(unit, "Service", "Delegate") == "yes"
    assert one(unit, "Service", "Restart") == "always"
    assert int(one(unit, "Service", "RestartSec")) > 0
    for key in ("LimitNOFILE", "LimitNPROC", "LimitCORE", "TasksMax"):
        assert one(unit, "Service", key) == "infinity"
    assert one(unit, "Service", "OOMScoreAdjust") == "-999"
    assert unit["Service"]["ExecStartPre"] == ["-/sbin/modprobe overlay", "-/sbin/modprobe br_netfilter"]
    assert set(one(unit, "Unit", "After").split()) == {"network-online.target", "local-fs.target"}
    assert one(unit, "Unit", "Wants") == "network-online.target"
    assert one(unit, "Install", "WantedBy") == "multi-user.target"


def test_exec_start_quoting():
    text = nodesetup.unit_text(["/x/husk-cri", "--config", "/etc/my husk/cri.toml", "--root", "/v/100%$HOME",
                                "--sandbox-image", 'a"b'])
    assert one(parse_unit(text), "Service", "ExecStart") == \
        '/x/husk-cri --config "/etc/my husk/cri.toml" --root /v/100%%$$HOME --sandbox-image "a\\"b"'


def test_contrib_unit_is_the_generated_one():
    """contrib/systemd/husk-cri.service is unit_text for /usr/local/bin/husk-cri; regenerate it with
    python -c 'from cri_server import nodesetup as n; print(n.unit_text([n.CONTRIB_EXEC]), end="")' > <file>."""
    assert CONTRIB_UNIT.read_text() == nodesetup.unit_text([nodesetup.CONTRIB_EXEC])


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_finds_nothing(tmp_path):
    exe = nodesetup.husk_cri_binary()
    nodesetup.install_unit([exe], str(tmp_path), booted=False)
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / nodesetup.UNIT_NAME)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_husk_cri_command_carries_config_and_flags(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = nodesetup.husk_cri_command("cri.toml", {"listen": "/run/x.sock", "cni_bin_dir": ("/a", "/b"),
                                                   "systemd_cgroup": True, "root": None, "runtime": "runc",
                                                   "log_level": None}, binary="/v/bin/husk-cri")
    assert argv == ["/v/bin/husk-cri", "--config", str(tmp_path / "cri.toml"), "--listen", "/run/x.sock",
                    "--cni-bin-dir", "/a", "--cni-bin-dir", "/b", "--systemd-cgroup", "--runtime", "runc"]
    assert nodesetup.husk_cri_command(None, {"systemd_cgroup": False}, binary="/b")[1:] == ["--no-systemd-cgroup"]


def test_husk_cri_binary_is_this_installs():
    exe = nodesetup.husk_cri_binary()
    assert os.path.isabs(exe) and os.access(exe, os.X_OK)
    assert os.path.dirname(exe) == os.path.dirname(sys.executable)   # the venv's, when run from the venv


def test_install_in_a_custom_dir_is_idempotent_and_reloads_on_change(tmp_path):
    d = tmp_path / "units"
    ctl = Systemctl()
    lines = nodesetup.install_unit(["/v/husk-cri"], str(d), booted=True, run=ctl)
    path = d / nodesetup.UNIT_NAME
    assert path.read_text() == nodesetup.unit_text(["/v/husk-cri"])
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert ctl.calls == [["systemctl", "daemon-reload"]]
    assert "written" in lines[0]
    mtime = path.stat().st_mtime_ns
    lines = nodesetup.install_unit(["/v/husk-cri"], str(d), booted=True, run=ctl)
    assert "up to date" in lines[0] and path.stat().st_mtime_ns == mtime
    assert ctl.calls == [["systemctl", "daemon-reload"]]        # nothing changed: no reload
    nodesetup.install_unit(["/v/husk-cri", "--systemd-cgroup"], str(d), booted=True, run=ctl)
    assert "ExecStart=/v/husk-cri --systemd-cgroup\n" in path.read_text()
    assert ctl.calls == [["systemctl", "daemon-reload"]] * 2
    assert sorted(os.listdir(d)) == [nodesetup.UNIT_NAME]        # no temp files left


def test_enable_with_systemd_running(tmp_path):
    ctl = Systemctl()
    nodesetup.install_unit(["/v/husk-cri"], str(tmp_path), enable=True, booted=True, run=ctl)
    assert ctl.calls == [["systemctl", "daemon-reload"], ["systemctl", "enable", "husk-cri.service"]]
    assert not (tmp_path / "multi-user.target.wants").exists()   # systemctl's job, not ours


def test_no_systemd_no_systemctl(tmp_path):
    ctl = Systemctl()
    lines = nodesetup.install_unit(["/v/husk-cri"], str(tmp_path), booted=False, run=ctl)
    assert ctl.calls == [] and "systemd is not running" in lines[-1]
    assert not (tmp_path / "multi-user.target.wants").exists()


def test_enable_without_systemd_makes_the_install_symlink(tmp_path):
    ctl = Systemctl()
    for _ in range(2):
        nodesetup.install_unit(["/v/husk-cri"], str(tmp_path), enable=True, booted=False, run=ctl)
    link = tmp_path / "multi-user.target.wants" / nodesetup.UNIT_NAME
    assert os.readlink(link) == str(tmp_path / nodesetup.UNIT_NAME)
    assert ctl.calls == []


def test_systemctl_failure_is_reported(tmp_path):
    with pytest.raises(RuntimeError, match="systemctl daemon-reload: exit 1: Failed to connect to bus"):
        nodesetup.install_unit(["/v/husk-cri"], str(tmp_path), booted=True, run=Systemctl(1))


def test_setup_cli_writes_the_unit_with_this_commands_flags(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(nodesetup, "setup_node", lambda config, catatonit: calls.append(config) or ["node ok"])
    monkeypatch.setattr(nodesetup, "systemd_running", lambda: False)
    conf = tmp_path / "cri.toml"
    conf.write_text("[runtime]\nsystemd_cgroup = true\n")
    d = tmp_path / "units"
    out = CliRunner().invoke(main, ["--config", str(conf), "--log-level", "debug", "setup", "--systemd-unit",
                                    "--unit-dir", str(d), "--enable"])
    assert out.exit_code == 0, out.output
    unit = parse_unit((d / nodesetup.UNIT_NAME).read_text())
    assert one(unit, "Service", "ExecStart") == \
        f"{nodesetup.husk_cri_binary()} --config {conf} --log-level debug"
    assert (d / "multi-user.target.wants" / nodesetup.UNIT_NAME).is_symlink()
    assert calls and calls[0].runtime.systemd_cgroup            # the node setup still runs, with this config
    assert "husk-cri setup: node ok" in out.output


def test_setup_enable_needs_the_unit(monkeypatch):
    monkeypatch.setattr(nodesetup, "setup_node", lambda config, catatonit: [])
    out = CliRunner().invoke(main, ["setup", "--enable"])
    assert out.exit_code == 2 and "--enable needs --systemd-unit" in out.output


# --- sd_notify ----------------------------------------------------------------------------------------------

def _listen(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(10)
    return s


def test_notify_sends_one_datagram(tmp_path):
    path = str(tmp_path / "notify")
    with _listen(path) as s:
        assert sdnotify.notify(sdnotify.READY, {"NOTIFY_SOCKET": path})
        assert s.recv(4096) == b"READY=1"


def test_notify_abstract_socket():
    name = f"husk-test-notify-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        s.settimeout(10)
        assert sdnotify.notify(sdnotify.STOPPING, {"NOTIFY_SOCKET": "@" + name})
        assert s.recv(4096) == b"STOPPING=1"


def test_notify_without_systemd_does_nothing(tmp_path):
    assert not sdnotify.notify(sdnotify.READY, {})
    assert not sdnotify.notify(sdnotify.READY, {"NOTIFY_SOCKET": "vsock:2:1234"})
    assert not sdnotify.notify(sdnotify.READY, {"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})


def test_take_socket_hides_it_from_children_and_keeps_it_for_notify(tmp_path, monkeypatch):
    monkeypatch.setattr(sdnotify, "_taken", "")
    path = str(tmp_path / "notify")
    env = {"NOTIFY_SOCKET": path, "PATH": "/bin"}
    assert sdnotify.take_socket(env) == path
    assert env == {"PATH": "/bin"}                  # what the spawner, shims and runtimes inherit
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    with _listen(path) as s:
        assert sdnotify.notify(sdnotify.READY)
        assert s.recv(4096) == b"READY=1"


def test_every_global_flag_is_spelled_as_husk_cri_command_writes_it():
    """husk_cri_command turns the group's parameters back into flags by name: each must have that spelling."""
    for param in main.params:
        if param.name in ("config_path", "version", "help") or not param.opts[0].startswith("--"):
            continue
        flag = "--" + param.name.replace("_", "-")
        assert flag in param.opts, (param.name, param.opts)
        if param.is_flag and param.secondary_opts:
            assert param.secondary_opts == ["--no-" + param.name.replace("_", "-")]
