"""`husk-cri setup`: what a node needs before husk-cri serves pods, done idempotently.

The sandbox image (built locally from the distro's catatonit and imported when it is not already there, so
a node without registry access can run pods), a default CNI config when the conf dir has none and, when asked,
the systemd unit that runs this husk-cri (`--systemd-unit`). Never touches a registry.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any, Callable, Mapping, Sequence

from cri_server.config import Config

UNIT_NAME = "husk-cri.service"
UNIT_DIR = "/etc/systemd/system"
WANTED_BY = "multi-user.target"
# The path contrib/systemd/husk-cri.service names (a test keeps that file equal to unit_text of it).
CONTRIB_EXEC = "/usr/local/bin/husk-cri"

_UNIT = """\
# husk-cri, the CRI server of the husk container runtime. kubelet's containerRuntimeEndpoint is its
# server.listen (default unix:///run/husk/cri.sock). Written by `husk-cri setup --systemd-unit`.
[Unit]
Description=husk-cri container runtime (CRI v1)
After=network-online.target local-fs.target
Wants=network-online.target

[Service]
# husk-cri tells systemd READY=1 once its CRI socket accepts connections.
Type=notify
# overlayfs for image layers; br_netfilter so bridged pod traffic passes iptables (kube-proxy). Best effort.
ExecStartPre=-/sbin/modprobe overlay
ExecStartPre=-/sbin/modprobe br_netfilter
ExecStart={exec_start}
Restart=always
RestartSec=5
# Stopping or restarting husk-cri leaves the shims and the containers running, as containerd.service does.
KillMode=process
# husk-cri and its shims may manage the cgroups below this unit.
Delegate=yes
LimitNOFILE=infinity
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
# Kill pods before the runtime when memory runs out (kubelet gives pods higher scores).
OOMScoreAdjust=-999

[Install]
WantedBy={wanted_by}
"""


async def _ensure_sandbox_image(config: Config, catatonit: str) -> str:
    from cri_server.images.service import ImageService
    rcd = config.registry.config_dir if os.path.isdir(config.registry.config_dir) else None
    images = ImageService(config.paths.root, rcd)
    try:
        ref = config.runtime.sandbox_image
        rec = images.get(ref)
        if rec is not None:
            return f"sandbox image {ref} present ({rec.id[:19]})"
        rec = await images.build_pause_image(ref, catatonit=catatonit)
        return f"sandbox image {ref} built from {catatonit} and imported ({rec.id[:19]})"
    finally:
        await images.close()


def setup_node(config: Config, catatonit: str = "/usr/bin/catatonit") -> list[str]:
    from cri_server.daemon import prepare_dirs
    from cri_server.network import defaults
    from cri_server.network.cni import CniManager
    prepare_dirs(config)
    done = [asyncio.run(_ensure_sandbox_image(config, catatonit))]
    status = CniManager(config.cni.conf_dir, config.cni.bin_dirs, config.cni_cache_dir).status()
    if status.ready:
        done.append(f"CNI network {status.network_name} from {status.config_file}")
    else:
        written = defaults.write_default(config.cni.conf_dir)
        if written:
            done.append(f"default CNI network written: {', '.join(written)} (bridge {defaults.DEFAULT_BRIDGE}, "
                        f"{defaults.DEFAULT_SUBNET}, local traffic only)")
        else:
            done.append(f"CNI config in {config.cni.conf_dir} is not usable: {status.message}")
    return done


# --- the systemd unit ---------------------------------------------------------------------------------------
def unit_text(exec_start: Sequence[str]) -> str:
    """The unit file running `exec_start` (argv: husk-cri and its flags)."""
    return _UNIT.format(exec_start=" ".join(_unit_quote(a) for a in exec_start), wanted_by=WANTED_BY)


def _unit_quote(arg: str) -> str:
    """One ExecStart word: systemd expands %specifiers and $VARS, splits on blanks and honours double quotes."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and not any(c in arg for c in ' \t"\'\\;'):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def husk_cri_binary() -> str:
    """This install's husk-cri: the console script beside the running interpreter (the venv's), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "husk-cri")
    if os.access(here, os.X_OK):
        return here
    import shutil
    found = shutil.which("husk-cri")
    if not found:
        raise FileNotFoundError(f"no husk-cri beside {sys.executable} or on PATH")
    return os.path.abspath(found)


def husk_cri_command(config_path: str | None, overrides: Mapping[str, Any], binary: str = "") -> list[str]:
    """argv of `husk-cri` serving with the config file and flags this setup was run with (FLAG_KEYS names)."""
    argv = [binary or husk_cri_binary()]
    if config_path:
        argv += ["--config", os.path.abspath(config_path)]
    for name, value in overrides.items():
        if value is None or value == () or value == []:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + name.replace("_", "-"))
        elif isinstance(value, (tuple, list)):
            for v in value:
                argv += [flag, str(v)]
        else:
            argv += [flag, str(value)]
    return argv


def systemd_running() -> bool:
    """systemd is the init (sd_booted(3): /run/systemd/system exists)."""
    return os.path.isdir("/run/systemd/system")


def install_unit(exec_start: Sequence[str], unit_dir: str = UNIT_DIR, enable: bool = False,
                 booted: bool | None = None, run: Callable[..., Any] = subprocess.run) -> list[str]:
    """Writes <unit_dir>/husk-cri.service (only when its content changes); with systemd running, reloads it
    (`systemctl daemon-reload`) and, when asked, enables it (`systemctl enable`). Without a running systemd
    (an image being built) enabling is the [Install] symlink systemctl would make. Never starts the unit."""
    from cri_server.podfiles import write_atomic
    path = os.path.join(unit_dir, UNIT_NAME)
    text = unit_text(exec_start)
    try:
        with open(path) as f:
            changed = f.read() != text
    except FileNotFoundError:
        changed = True
    done = []
    if changed:
        os.makedirs(unit_dir, mode=0o755, exist_ok=True)
        write_atomic(path, text, 0o644)
        done.append(f"systemd unit {path} written (ExecStart={text.split('ExecStart=')[1].splitlines()[0]})")
    else:
        done.append(f"systemd unit {path} up to date")
    booted = systemd_running() if booted is None else booted
    if booted:
        if changed:
            _systemctl(run, "daemon-reload")
            done.append("systemctl daemon-reload")
        if enable:
            _systemctl(run, "enable", UNIT_NAME)
            done.append(f"systemctl enable {UNIT_NAME}")
    elif enable:
        done.append(_enable_offline(unit_dir, path))
    else:
        done.append("systemd is not running here: nothing reloaded")
    return done


def _systemctl(run: Callable[..., Any], *args: str) -> None:
    proc = run(["systemctl", *args], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"systemctl {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")


def _enable_offline(unit_dir: str, path: str) -> str:
    wants = os.path.join(unit_dir, f"{WANTED_BY}.wants")
    link = os.path.join(wants, UNIT_NAME)
    os.makedirs(wants, mode=0o755, exist_ok=True)
    if os.path.islink(link) and os.readlink(link) == path:
        return f"{UNIT_NAME} already enabled ({link})"
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(path, link)
    return f"{UNIT_NAME} enabled without a running systemd: {link} -> {path}"
