"""The husk-cri command line (click): serve (the default), `config default`, `config show`.

Only parses flags into a Config (flags override the file) and calls the daemon; no logic of its own.
"""
from __future__ import annotations

import sys
from typing import Any

import click

from cri_server import config as cfg
from cri_server.logs import LEVELS
from cri_server.version import VERSION


def _effective(ctx: click.Context) -> cfg.Config:
    p = ctx.ensure_object(dict)
    try:
        return cfg.with_overrides(cfg.load(p["config"]), p["overrides"])
    except cfg.ConfigError as e:
        raise click.UsageError(str(e)) from None


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(VERSION, prog_name="husk-cri")
@click.option("--config", "config_path", metavar="FILE", envvar="HUSK_CRI_CONFIG",
              help=f"TOML config file (default {cfg.DEFAULT_CONFIG_PATH} if it exists).")
@click.option("--listen", metavar="PATH", help="Unix socket to serve on (path or unix:///path).")
@click.option("--root", metavar="DIR", help="Persistent state directory.")
@click.option("--state", metavar="DIR", help="Volatile run directory.")
@click.option("--sandbox-image", metavar="REF", help="Image of the pause container.")
@click.option("--cni-conf-dir", metavar="DIR", help="CNI network config directory.")
@click.option("--cni-bin-dir", metavar="DIR", multiple=True, help="CNI plugin directory (repeatable).")
@click.option("--registry-config-dir", metavar="DIR", help="Registry hosts: containerd's hosts.toml layout.")
@click.option("--stream-address", metavar="ADDR", help="Address of the exec/attach/port-forward server.")
@click.option("--stream-tls-cert", metavar="FILE", help="PEM certificate: the streaming server speaks TLS only.")
@click.option("--stream-tls-key", metavar="FILE", help="PEM private key of --stream-tls-cert.")
@click.option("--stream-tls-ca", metavar="FILE", help="PEM CA: streaming clients must present a certificate it "
                                                      "signed.")
@click.option("--metrics-address", metavar="HOST:PORT", help="Serve Prometheus metrics on http://HOST:PORT/metrics "
                                                             "(off by default).")
@click.option("--runtime", metavar="BINARY", help="OCI runtime of the default handler, or in-process.")
@click.option("--systemd-cgroup/--no-systemd-cgroup", "systemd_cgroup", default=None,
              help="Cgroup driver: systemd (kubelet's cgroupDriver: systemd) or cgroupfs (the default).")
@click.option("--log-level", type=click.Choice(list(LEVELS), case_sensitive=False))
@click.pass_context
def main(ctx: click.Context, config_path: str | None, **overrides: Any) -> None:
    """husk-cri: the CRI v1 server kubelet and crictl talk to."""
    ctx.ensure_object(dict).update(config=config_path, overrides=overrides)
    if ctx.invoked_subcommand == "images":
        # The image commands read --root/--registry-config-dir of this group; a config file names them too.
        config = _effective(ctx)
        ctx.params["root"] = ctx.params.get("root") or config.paths.root
        ctx.params["registry_config_dir"] = ctx.params.get("registry_config_dir") or config.registry.config_dir
    if ctx.invoked_subcommand is not None:
        return
    from cri_server import daemon
    config = _effective(ctx)
    try:
        sys.exit(daemon.run(config))
    except daemon.StartupError as e:
        click.echo(f"husk-cri: {e}", err=True)
        sys.exit(1)


@main.group("config")
def config_group() -> None:
    """Print configuration."""


@config_group.command("default")
def config_default() -> None:
    """Print the built-in defaults as a TOML file."""
    click.echo(cfg.to_toml(cfg.Config()), nl=False)


@config_group.command("show")
@click.pass_context
def config_show(ctx: click.Context) -> None:
    """Print the effective configuration (file plus flags)."""
    click.echo(cfg.to_toml(_effective(ctx)), nl=False)


@main.command("setup")
@click.option("--catatonit", default="/usr/bin/catatonit", show_default=True, metavar="PATH",
              help="Static init binary the sandbox image is built from when it is missing.")
@click.option("--systemd-unit", is_flag=True,
              help="Also write husk-cri.service running this husk-cri with this command's --config and flags "
                   "(and systemctl daemon-reload when systemd runs).")
@click.option("--unit-dir", default="/etc/systemd/system", show_default=True, metavar="DIR",
              help="Where --systemd-unit writes the unit.")
@click.option("--enable", is_flag=True, help="With --systemd-unit: enable the unit (it is never started here).")
@click.pass_context
def setup(ctx: click.Context, catatonit: str, systemd_unit: bool, unit_dir: str, enable: bool) -> None:
    """Prepare the node: the sandbox image (built locally when absent), a default CNI config (when none) and,
    with --systemd-unit, the systemd unit."""
    from cri_server import nodesetup
    config = _effective(ctx)
    if enable and not systemd_unit:
        raise click.UsageError("--enable needs --systemd-unit")
    if systemd_unit:
        p = ctx.ensure_object(dict)
        try:
            argv = nodesetup.husk_cri_command(p["config"], p["overrides"])
            lines = nodesetup.install_unit(argv, unit_dir, enable)
        except (OSError, RuntimeError) as e:
            raise click.ClickException(f"systemd unit: {e}") from None
        for line in lines:
            click.echo(f"husk-cri setup: {line}")
    for line in nodesetup.setup_node(config, catatonit):
        click.echo(f"husk-cri setup: {line}")


# --- inspection without husk-cri (cri_server/offline.py): the store read-only, each shim asked ---------------
_SHIM_TIMEOUT = click.option("--shim-timeout", type=float, default=1.0, show_default=True, metavar="SECONDS",
                             help="How long each shim may take to answer.")


def _offline(ctx: click.Context, run: Any) -> None:
    from cri_server import offline
    config = _effective(ctx)
    offline.note(config.db_path, config.paths.state)
    try:
        sys.exit(run(offline, config))
    except offline.OfflineError as e:
        raise click.ClickException(str(e)) from None
    except KeyboardInterrupt:
        sys.exit(130)


@main.command("pods")
@_SHIM_TIMEOUT
@click.pass_context
def pods_cmd(ctx: click.Context, shim_timeout: float) -> None:
    """List pod sandboxes as `crictl pods` does, read directly (works while husk-cri is down or hangs)."""
    _offline(ctx, lambda o, c: o.cmd_pods(c, sys.stdout, shim_timeout))


@main.command("ps")
@click.option("-a", "--all", "all_states", is_flag=True, help="Show exited containers too.")
@_SHIM_TIMEOUT
@click.pass_context
def ps_cmd(ctx: click.Context, all_states: bool, shim_timeout: float) -> None:
    """List containers as `crictl ps` does, read directly (works while husk-cri is down or hangs)."""
    _offline(ctx, lambda o, c: o.cmd_ps(c, sys.stdout, all_states, shim_timeout))


@main.command("inspect")
@click.argument("ids", nargs=-1, required=True, metavar="ID...")
@_SHIM_TIMEOUT
@click.pass_context
def inspect_cmd(ctx: click.Context, ids: tuple[str, ...], shim_timeout: float) -> None:
    """Print a container's or pod sandbox's status and info as JSON (crictl inspect/inspectp), read directly.
    ID may be a unique prefix."""
    _offline(ctx, lambda o, c: o.cmd_inspect(c, sys.stdout, list(ids), shim_timeout))


@main.command("logs")
@click.option("-f", "--follow", is_flag=True, help="Follow the log (across kubelet's rotations) until the "
                                                   "container ends.")
@click.option("--tail", "tail_lines", type=int, default=-1, metavar="N", help="Only the last N lines.")
@click.argument("container_id", metavar="ID")
@_SHIM_TIMEOUT
@click.pass_context
def logs_cmd(ctx: click.Context, follow: bool, tail_lines: int, container_id: str, shim_timeout: float) -> None:
    """Print a container's log as `crictl logs` does, read from its CRI log file directly."""
    _offline(ctx, lambda o, c: o.cmd_logs(c, sys.stdout.buffer, sys.stderr.buffer, container_id, follow,
                                          tail_lines, shim_timeout))


@main.command("trace")
@click.argument("object_id", metavar="ID", required=False, default="")
@click.option("--failed", is_flag=True, help="List the kept traces of creations that failed.")
@click.option("--width", type=int, default=0, metavar="COLUMNS", help="Width of the waterfall (default: the "
                                                                      "terminal's).")
@click.pass_context
def trace_cmd(ctx: click.Context, object_id: str, failed: bool, width: int) -> None:
    """Print the start-up trace of a pod sandbox or container as a waterfall (cri_server/trace.py), read
    directly from the store. ID may be a unique prefix, also of a creation that failed."""
    if not object_id and not failed:
        raise click.UsageError("give an ID or --failed")
    from cri_server import trace
    _offline(ctx, lambda o, c: trace.cmd_trace(c, sys.stdout, object_id, failed, width))


def _mount_subcommands() -> None:
    # `husk-cri images ...`: the image operator commands (cri_server/images/cli.py); importing them costs
    # only click, so it is done here rather than on demand.
    from cri_server.images.cli import images
    main.add_command(images)


_mount_subcommands()
