"""The stdlib fast path agrees with the click definitions on the command lines containerd and podman send,
and declines (falls back to click) on everything else."""
from __future__ import annotations

import click
import pytest

from runtime import commands, fastcli

LINES = [
    ["--root", "/run/containerd/runc/k8s.io", "--log", "/b/log.json", "--log-format", "json", "create",
     "--bundle", "/b", "--pid-file", "/b/init.pid", "c1"],
    ["--root", "/r", "--log", "/b/log.json", "--log-format", "json", "create", "--bundle", "/b", "--pid-file",
     "/b/init.pid", "--console-socket", "/run/pty.sock", "--no-pivot", "--no-new-keyring", "--preserve-fds", "2",
     "c1"],
    ["--systemd-cgroup", "create", "--bundle", "/b", "--pid-file", "/p", "c1"],
    ["create", "-b", "/b", "c1"],
    ["create", "--bundle=/b", "--pid-file=/p", "c1"],
    ["--root", "/r", "start", "c1"],
    ["--root", "/r", "--log", "/l", "--log-format", "json", "state", "c1"],
    ["--root", "/r", "kill", "c1", "9"],
    ["--root", "/r", "kill", "--all", "c1", "SIGKILL"],
    ["kill", "c1"],
    ["kill", "-a", "c1", "15"],
    ["--root", "/r", "delete", "--force", "c1"],
    ["delete", "-f", "c1"],
    ["--debug", "delete", "c1"],
    ["--root", "/r", "run", "--bundle", "/b", "c1"],
    ["run", "-d", "-b", "/b", "--pid-file", "/p", "--keep", "--no-pivot", "c1"],
    # containerd's shim and conmon (tests/data/runc-argv)
    ["--root", "/r", "--log", "/b/log.json", "--log-format", "json", "exec", "--process", "/t/p.json", "--detach",
     "--pid-file", "/t/e.pid", "c1"],
    ["--root", "/r", "exec", "--process", "/t/p.json", "--console-socket", "/t/s", "--detach", "--pid-file",
     "/t/e.pid", "c1"],
    ["exec", "--pid-file", "/t/e.pid", "--process", "/t/p.json", "--detach", "--tty", "--console-socket", "/t/s",
     "c1"],
    ["exec", "-p", "/t/p.json", "--preserve-fds", "2", "--ignore-paused", "c1"],
]

DECLINED = [
    ["run", "--help"], ["--help"], ["create", "--help"], ["create", "--bogus", "c1"], ["state"], ["state", "a", "b"],
    ["list"], ["exec", "c1", "ls"], ["exec", "-p", "/p.json", "c1", "ls"], ["exec", "--user", "1", "-p", "/p", "c1"],
    ["exec", "-p", "/p"], ["kill", "c1", "9", "extra"], ["--root"], ["create", "--preserve-fds", "x", "c"],
    ["--log-format", "yaml", "state", "c"], ["delete", "--force=true", "c"], [],
]


def click_parse(args: list[str]) -> tuple[dict, str, dict]:
    """The (globals, verb, params) click would produce for `args`, without running the command."""
    ctx = commands.cli.make_context("husk", list(args), resilient_parsing=False)
    # click 8.2 keeps the subcommand in the private _protected_args; click 9 puts everything in args
    remaining = list(getattr(ctx, "_protected_args", None) or []) + list(ctx.args)
    sub, rest = remaining[0], remaining[1:]
    cmd = commands.cli.get_command(ctx, sub)
    sctx = cmd.make_context(sub, list(rest), parent=ctx)
    g = {k: v for k, v in ctx.params.items() if k != "rootless"}
    return g, sub, dict(sctx.params)


def to_click_names(verb: str, kw: dict) -> dict:
    out = dict(kw)
    if verb == "kill":
        out["all_"] = out.pop("all")
        out["signal"] = out.pop("sig")
    if verb == "exec":  # the flags the fast path declines keep click's defaults
        out.update(cwd=None, env=(), user=None, additional_gids=(), cap=(), no_new_privs=False, apparmor=None,
                   process_label=None, cgroup=(), command=())
    return out


@pytest.mark.parametrize("args", LINES, ids=[" ".join(a)[:70] for a in LINES])
def test_fast_path_agrees_with_click(args: list[str]) -> None:
    parsed = fastcli.parse(args)
    assert parsed is not None, "the fast path must take this command line"
    g, verb, kw = parsed
    cg, cverb, cparams = click_parse(args)
    assert verb == cverb
    assert {"root": g.root, "log": g.log, "log_format": g.log_format, "debug": g.debug,
            "systemd_cgroup": g.systemd_cgroup} == cg
    assert to_click_names(verb, kw) == cparams


@pytest.mark.parametrize("args", DECLINED, ids=[" ".join(a)[:70] or "empty" for a in DECLINED])
def test_fast_path_declines_other_lines(args: list[str]) -> None:
    assert fastcli.parse(args) is None


def test_fast_flags_exist_in_click() -> None:
    for verb, table in fastcli.VERB_FLAGS.items():
        cmd = commands.cli.commands[verb]
        opts = {o for p in cmd.params if isinstance(p, click.Option) for o in p.opts}
        assert set(table) <= opts, verb
    gopts = {o for p in commands.cli.params if isinstance(p, click.Option) for o in p.opts}
    assert set(fastcli.GLOBAL_FLAGS) <= gopts


def test_fast_path_does_not_import_click() -> None:
    import subprocess
    import sys
    code = ("import sys; from runtime import cli; cli.main(['--root', '/nonexistent-husk-root', 'state', 'x']); "
            "print('click' in sys.modules, 'json' in sys.modules, 're' in sys.modules)")
    cp = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {repr(str(__import__('pathlib').Path(__file__).resolve().parents[2]))}); " + code],
                        capture_output=True, text=True)
    assert cp.stdout.strip() == "False False False", cp.stderr


def test_exec_with_process_file_does_not_import_click(tmp_path) -> None:
    """conmon and containerd's shim run `exec --process FILE ... ID` for every exec (health checks too)."""
    import subprocess
    import sys
    pf = tmp_path / "p.json"
    pf.write_text('{"args": ["true"], "cwd": "/"}')
    top = repr(str(__import__('pathlib').Path(__file__).resolve().parents[2]))
    code = (f"import sys; sys.path.insert(0, {top}); from runtime import cli; "
            f"rc = cli.main(['--root', {str(tmp_path / 'root')!r}, 'exec', '--process', {str(pf)!r}, '--detach', "
            f"'x']); print(rc, 'click' in sys.modules)")
    cp = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True)
    assert cp.stdout.strip() == "255 False", cp.stderr
    assert "exec failed: " in cp.stderr and "does not exist" in cp.stderr
