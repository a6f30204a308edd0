"""The click CLI: every command with runc's flags, help text and errors. The lifecycle verbs usually take the
fast path in fastcli.py; this module is imported only when that parser declines the command line.

Commands only parse flags and call runtime.lifecycle (through the cmd_* helpers in cli.py).
"""
from __future__ import annotations

import os
import sys
from typing import Any

import click

from runtime import cli as c
from runtime.errors import HuskError
from runtime.state import OCI_VERSION

VERSION = "0.1.0"


def _g(ctx: click.Context) -> c.Globals:
    return ctx.find_root().obj


def _finish(ctx: click.Context, rc: int) -> None:
    ctx.exit(rc)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--root", default=c.DEFAULT_ROOT, show_default=True, help="root directory for container state (tmpfs)")
@click.option("--log", default=None, help="append error records to this file (default: stderr only)")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="format of the --log records")
@click.option("--debug", is_flag=True, help="debug logging")
@click.option("--systemd-cgroup", is_flag=True,
              help="create: put the container in a systemd transient scope (cgroupsPath slice:prefix:name; cgroup v2)")
@click.option("--rootless", default=None, help="accepted for runc compatibility (true|false|auto)")
@click.version_option(VERSION, message=f"husk version %(version)s\nspec: {OCI_VERSION}")
@click.pass_context
def cli(ctx: click.Context, root: str, log: str | None, log_format: str, debug: bool, systemd_cgroup: bool,
        rootless: str | None) -> None:
    """husk: an OCI runtime with runc's command line."""
    ctx.obj = c.Globals(root=root, log=log, log_format=log_format, debug=debug, systemd_cgroup=systemd_cgroup)


@cli.command()
@click.option("--bundle", "-b", default=".", show_default=True, help="path to the bundle directory")
@click.option("--console-socket", default=None, help="unix socket that receives the pty master (terminal)")
@click.option("--pid-file", default=None, help="write the init's pid to this file")
@click.option("--no-pivot", is_flag=True, help="use MS_MOVE + chroot instead of pivot_root")
@click.option("--no-new-keyring", is_flag=True, help="keep the caller's session keyring")
@click.option("--preserve-fds", default=0, type=int, help="pass this many fds after stdio to the container")
@click.argument("container_id")
@click.pass_context
def create(ctx: click.Context, bundle: str, console_socket: str | None, pid_file: str | None, no_pivot: bool,
           no_new_keyring: bool, preserve_fds: int, container_id: str) -> None:
    """Create a container; its process waits until `start`."""
    g = _g(ctx)
    _finish(ctx, c.guard(g, lambda: c.cmd_create(g, container_id, bundle, console_socket, pid_file, no_pivot,
                                                   no_new_keyring, preserve_fds)))


@cli.command()
@click.argument("container_id")
@click.pass_context
def start(ctx: click.Context, container_id: str) -> None:
    """Start the process of a created container."""
    g = _g(ctx)
    _finish(ctx, c.guard(g, lambda: c.cmd_start(g, container_id)))


@cli.command()
@click.argument("container_id")
@click.pass_context
def state(ctx: click.Context, container_id: str) -> None:
    """Print the OCI state of a container as JSON."""
    g = _g(ctx)
    _finish(ctx, c.guard(g, lambda: c.cmd_state(g, container_id)))


@cli.command()
@click.option("--all", "-a", "all_", is_flag=True, help="signal every process in the container's cgroup")
@click.argument("container_id")
@click.argument("signal", default="SIGTERM")
@click.pass_context
def kill(ctx: click.Context, all_: bool, container_id: str, signal: str) -> None:
    """Send a signal (name or number, default SIGTERM) to the container's init."""
    g = _g(ctx)
    _finish(ctx, c.guard(g, lambda: c.cmd_kill(g, container_id, signal, all_)))


@cli.command()
@click.option("--force", "-f", is_flag=True, help="kill the container first if it is not stopped")
@click.argument("container_id")
@click.pass_context
def delete(ctx: click.Context, force: bool, container_id: str) -> None:
    """Delete a stopped or created container (and its cgroup and state); a created one is killed first."""
    g = _g(ctx)
    _finish(ctx, c.guard(g, lambda: c.cmd_delete(g, container_id, force)))


@cli.command()
@click.option("--bundle", "-b", default=".", show_default=True, help="path to the bundle directory")
@click.option("--console-socket", default=None, help="unix socket that receives the pty master (terminal)")
@click.option("--pid-file", default=None, help="write the init's pid to this file")
@click.option("--detach", "-d", is_flag=True, help="do not wait for the container")
@click.option("--keep", is_flag=True, help="do not delete the container after it exits")
@click.option("--no-pivot", is_flag=True, help="use MS_MOVE + chroot instead of pivot_root")
@click.option("--no-new-keyring", is_flag=True, help="keep the caller's session keyring")
@click.option("--preserve-fds", default=0, type=int, help="pass this many fds after stdio to the container")
@click.argument("container_id")
@click.pass_context
def run(ctx: click.Context, bundle: str, console_socket: str | None, pid_file: str | None, detach: bool,
        keep: bool, no_pivot: bool, no_new_keyring: bool, preserve_fds: int, container_id: str) -> None:
    """Create and start a container; without -d wait and exit with its status (128+signal if killed)."""
    g = _g(ctx)
    _finish(ctx, c.guard(g, lambda: c.cmd_run(g, container_id, bundle, console_socket, pid_file, detach, keep,
                                                no_pivot, no_new_keyring, preserve_fds)))


@cli.command()
@click.option("--bundle", "-b", default=".", show_default=True, help="directory to write config.json into")
@click.option("--rootless", is_flag=True, help="a spec for an unprivileged user (user namespace)")
@click.pass_context
def spec(ctx: click.Context, bundle: str, rootless: bool) -> None:
    """Write a default config.json into the bundle directory."""
    g = _g(ctx)

    def do() -> int:
        from runtime.spec import default_spec
        from runtime.state import dumps_json
        path = os.path.join(bundle, "config.json")
        if os.path.exists(path):
            raise HuskError(f"{path} already exists: remove it first")
        with open(path, "w") as f:
            f.write(dumps_json(default_spec(rootless, os.getuid(), os.getgid()), indent=2) + "\n")
        return 0
    _finish(ctx, c.guard(g, do))


def _owner(state_dir: str) -> str:
    """The user name owning a container's state dir, "#uid" if it has none (runc's list)."""
    import pwd
    try:
        uid = os.stat(state_dir).st_uid
    except OSError:
        return ""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"#{uid}"


@cli.command("list")
@click.option("--format", "-f", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--quiet", "-q", is_flag=True, help="print only the container ids")
@click.pass_context
def list_(ctx: click.Context, fmt: str, quiet: bool) -> None:
    """List the containers under --root."""
    g = _g(ctx)

    def do() -> int:
        from runtime import lifecycle
        from runtime.state import dumps_json
        items = lifecycle.list_containers(g.root)
        if quiet:
            for s in items:
                click.echo(s["id"])
            return 0
        # runc's list names the owner of each state dir (its `state` leaves "owner" empty)
        items = [dict(s, owner=_owner(os.path.join(g.root, s["id"]))) for s in items]
        if fmt == "json":
            click.echo(dumps_json(items))
        else:
            rows = [("ID", "PID", "STATUS", "BUNDLE", "CREATED", "OWNER")]
            rows += [(s["id"], str(s["pid"]), s["status"], s["bundle"], s["created"], s["owner"]) for s in items]
            # runc's text/tabwriter (minwidth 12, padding 3): each column but the last is max(12, widest + 3)
            widths = [max(12, max(len(r[i]) for r in rows) + 3) for i in range(5)]
            for r in rows:
                click.echo("".join(v.ljust(w) for v, w in zip(r, widths)) + r[5])
        return 0
    _finish(ctx, c.guard(g, do))


# As runc: options after the container id are ps's own (`husk ps ID -ef`), not husk's.
@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--format", "-f", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.argument("container_id")
@click.argument("ps_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def ps(ctx: click.Context, fmt: str, container_id: str, ps_args: tuple[str, ...]) -> None:
    """List the processes in a container (ps -ef filtered to its cgroup, or a JSON array of pids)."""
    g = _g(ctx)

    def do() -> int:
        from runtime import lifecycle
        pids = lifecycle.processes(g.root, container_id)
        if fmt == "json":
            from runtime.state import dumps_json
            click.echo(dumps_json(pids))
            return 0
        import subprocess
        out = subprocess.run(["ps", *(ps_args or ("-ef",))], capture_output=True, text=True, check=True).stdout
        lines = out.splitlines()
        if not lines:
            return 0
        header = lines[0].split()
        if "PID" not in header:
            raise HuskError("ps output has no PID column")
        col = header.index("PID")
        click.echo(lines[0])
        wanted = {str(p) for p in pids}
        for line in lines[1:]:
            fields = line.split()
            if len(fields) > col and fields[col] in wanted:
                click.echo(line)
        return 0
    _finish(ctx, c.guard(g, do))


@cli.command("exec", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--process", "-p", "process_file", default=None, help="an OCI process JSON file (then no command)")
@click.option("--tty", "-t", is_flag=True, help="allocate a pty (with --console-socket, or proxied in the foreground)")
@click.option("--console-socket", default=None, help="unix socket that receives the pty master")
@click.option("--detach", "-d", is_flag=True, help="do not wait for the process")
@click.option("--pid-file", default=None, help="write the process's pid to this file")
@click.option("--cwd", default=None, help="working directory inside the container")
@click.option("--env", "-e", multiple=True, help="KEY=value added to the environment (repeatable)")
@click.option("--user", "-u", default=None, help="uid[:gid] (numbers)")
@click.option("--additional-gids", "-g", multiple=True, type=int, help="extra group ids (repeatable)")
@click.option("--cap", "-c", multiple=True, help="add a capability to every set (e.g. CAP_NET_ADMIN; repeatable)")
@click.option("--no-new-privs", is_flag=True, help="set no_new_privs for the process")
@click.option("--apparmor", default=None, help="AppArmor profile for the process")
@click.option("--process-label", default=None, help="SELinux label (an error: SELinux is not supported)")
@click.option("--preserve-fds", default=0, type=int, help="pass this many fds after stdio to the process")
@click.option("--cgroup", multiple=True, help="run in an existing sub-cgroup: [controller[,controller]:]path")
@click.option("--ignore-paused", is_flag=True, help="allow exec in a paused container")
@click.argument("container_id")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def exec_(ctx: click.Context, process_file: str | None, tty: bool, console_socket: str | None, detach: bool,
          pid_file: str | None, cwd: str | None, env: tuple[str, ...], user: str | None,
          additional_gids: tuple[int, ...], cap: tuple[str, ...], no_new_privs: bool, apparmor: str | None,
          process_label: str | None, preserve_fds: int, cgroup: tuple[str, ...], ignore_paused: bool,
          container_id: str, command: tuple[str, ...]) -> None:
    """Run a new process inside a running container; exits with its status (255 if it could not start)."""
    g = _g(ctx)

    def do() -> int:
        from runtime import execflags, lifecycle
        if process_file:
            process = execflags.load_process_file(process_file)
        else:
            from runtime import state as st
            template = st.load(g.root, container_id).config.get("process") or {}
            process = execflags.from_flags(template, list(command), tty=tty, cwd=cwd, env=env, user=user,
                                           additional_gids=additional_gids, caps=cap, no_new_privs=no_new_privs,
                                           apparmor=apparmor, process_label=process_label)
        rc = lifecycle.exec_process(g.root, container_id, process, console_socket=console_socket,
                                    pid_file=pid_file, detach=detach, preserve_fds=preserve_fds,
                                    cgroup=execflags.sub_cgroups(cgroup) or None, ignore_paused=ignore_paused)
        return 0 if detach else rc
    # runc: a process that could not be started is "exec failed: ..." with status 255
    _finish(ctx, c.guard(g, do, fail_code=255, prefix="exec failed: "))


@cli.command()
@click.argument("container_id")
@click.pass_context
def pause(ctx: click.Context, container_id: str) -> None:
    """Freeze every process of a running container."""
    g = _g(ctx)
    from runtime import lifecycle
    _finish(ctx, c.guard(g, lambda: lifecycle.pause(g.root, container_id)))


@cli.command()
@click.argument("container_id")
@click.pass_context
def resume(ctx: click.Context, container_id: str) -> None:
    """Thaw a paused container."""
    g = _g(ctx)
    from runtime import lifecycle
    _finish(ctx, c.guard(g, lambda: lifecycle.resume(g.root, container_id)))


@cli.command()
@click.option("--resources", "-r", "resources", default=None,
              help="a linux.resources JSON file, '-' for stdin (then the other flags are ignored)")
@click.option("--blkio-weight", default=None, help="block IO weight, 10..1000")
@click.option("--cpu-period", default=None, help="CPU CFS period (microseconds)")
@click.option("--cpu-quota", default=None, help="CPU CFS quota (microseconds per period)")
@click.option("--cpu-share", default=None, help="CPU shares (relative weight)")
@click.option("--cpu-rt-period", default=None, help="CPU realtime period (microseconds)")
@click.option("--cpu-rt-runtime", default=None, help="CPU realtime runtime (microseconds per period)")
@click.option("--cpuset-cpus", default=None, help="CPUs to use (e.g. 0-2,4)")
@click.option("--cpuset-mems", default=None, help="memory nodes to use")
@click.option("--memory", default=None, help="memory limit (bytes, or 64m, 1g ...; -1 unlimited)")
@click.option("--memory-reservation", default=None, help="memory soft limit")
@click.option("--memory-swap", default=None, help="memory + swap limit (-1 unlimited)")
@click.option("--pids-limit", default=None, help="maximum number of pids (-1 unlimited)")
@click.option("--l3-cache-schema", default=None, help="Intel RDT L3 cache schema (not supported: an error)")
@click.option("--mem-bw-schema", default=None, help="Intel RDT memory bandwidth schema (not supported: an error)")
@click.argument("container_id")
@click.pass_context
def update(ctx: click.Context, resources: str | None, l3_cache_schema: str | None, mem_bw_schema: str | None,
           container_id: str, **flags: str | None) -> None:
    """Change the cgroup limits of a running container (runc's flags, or a linux.resources JSON)."""
    g = _g(ctx)

    def do() -> int:
        from runtime import lifecycle, update as up
        if l3_cache_schema or mem_bw_schema:
            raise HuskError("Intel RDT (--l3-cache-schema/--mem-bw-schema) is not supported by husk")
        res = up.read_resources(resources) if resources is not None else up.from_flags(flags)
        lifecycle.update(g.root, container_id, res)
        return 0
    _finish(ctx, c.guard(g, do))


@cli.command()
@click.option("--interval", default="5s", show_default=True, help="time between stats events (Go duration: 5s, 500ms)")
@click.option("--stats", "stats_once", is_flag=True, help="print the container's stats once, then exit")
@click.argument("container_id")
@click.pass_context
def events(ctx: click.Context, interval: str, stats_once: bool, container_id: str) -> None:
    """Print a running container's events (stats every --interval, OOM notifications) as JSON lines."""
    g = _g(ctx)

    def do() -> int:
        from runtime import events as ev
        seconds = ev.parse_duration(interval)
        try:
            return ev.run(g.root, container_id, interval=seconds, stats_once=stats_once)
        except KeyboardInterrupt:
            return 130
    _finish(ctx, c.guard(g, do))


@cli.command()
@click.argument("container_id")
@click.option("--image-path", default=None)
@click.option("--work-path", default=None)
@click.option("--parent-path", default=None)
@click.option("--leave-running", is_flag=True)
@click.option("--tcp-established", is_flag=True)
@click.option("--ext-unix-sk", is_flag=True)
@click.option("--shell-job", is_flag=True)
@click.option("--lazy-pages", is_flag=True)
@click.option("--status-fd", default=None)
@click.option("--page-server", default=None)
@click.option("--file-locks", is_flag=True)
@click.option("--pre-dump", is_flag=True)
@click.option("--manage-cgroups-mode", default=None)
@click.option("--empty-ns", multiple=True)
@click.option("--auto-dedup", is_flag=True)
@click.pass_context
def checkpoint(ctx: click.Context, container_id: str, **_criu: Any) -> None:
    """Not supported: husk has no CRIU checkpoint/restore (an error, the container is not touched)."""
    g = _g(ctx)
    _finish(ctx, c.guard(g, lambda: _no_criu("checkpoint", container_id)))


@cli.command()
@click.argument("container_id")
@click.option("--bundle", "-b", default=None)
@click.option("--console-socket", default=None)
@click.option("--pid-file", default=None)
@click.option("--detach", "-d", is_flag=True)
@click.option("--image-path", default=None)
@click.option("--work-path", default=None)
@click.option("--tcp-established", is_flag=True)
@click.option("--ext-unix-sk", is_flag=True)
@click.option("--shell-job", is_flag=True)
@click.option("--file-locks", is_flag=True)
@click.option("--manage-cgroups-mode", default=None)
@click.option("--no-subreaper", is_flag=True)
@click.option("--no-pivot", is_flag=True)
@click.option("--empty-ns", multiple=True)
@click.option("--auto-dedup", is_flag=True)
@click.option("--lazy-pages", is_flag=True)
@click.option("--lsm-profile", default=None)
@click.option("--lsm-mount-context", default=None)
@click.pass_context
def restore(ctx: click.Context, container_id: str, **_criu: Any) -> None:
    """Not supported: husk has no CRIU checkpoint/restore (an error; nothing is created)."""
    g = _g(ctx)
    _finish(ctx, c.guard(g, lambda: _no_criu("restore", container_id)))


def _no_criu(verb: str, container_id: str) -> int:
    raise HuskError(f"{verb} {container_id}: checkpoint/restore is not supported by husk (it has no CRIU "
                    f"integration); nothing was changed")


@cli.command()
@click.pass_context
def features(ctx: click.Context) -> None:
    """Print what this runtime supports (the runtime-spec features JSON), computed from its own tables."""
    g = _g(ctx)

    def do() -> int:
        from runtime.features import document
        from runtime.state import dumps_json
        click.echo(dumps_json(document(), indent=4))
        return 0
    _finish(ctx, c.guard(g, do))


def run_click(args: list[str]) -> int:
    try:
        rc = cli.main(args=args, prog_name="husk", standalone_mode=False)
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return e.exit_code if e.exit_code else 1
    except click.exceptions.Abort:
        return 1
    return rc if isinstance(rc, int) else 0
