"""The `husk` entry point: the stdlib fast path for runc's lifecycle verbs, else the click CLI (commands.py).

Owns error reporting (stderr, and --log as text or JSON records the way runc writes them) and exit codes.
Must not import click (or json) unless the fast path declines the command line.
"""
from __future__ import annotations

import os
import sys
TYPE_CHECKING = False  # typing costs ~2 ms to import; mypy treats this name as typing's

from runtime.errors import HuskError, describe

if TYPE_CHECKING:
    from collections.abc import Callable

DEFAULT_ROOT = "/run/husk"


class Globals:
    """The global flags. A plain class, not a dataclass: `dataclasses` imports inspect (tens of ms)."""
    __slots__ = ("root", "log", "log_format", "debug", "systemd_cgroup")

    def __init__(self, root: str = DEFAULT_ROOT, log: str | None = None, log_format: str = "text",
                 debug: bool = False, systemd_cgroup: bool = False) -> None:
        self.root = root
        self.log = log
        self.log_format = log_format
        self.debug = debug
        self.systemd_cgroup = systemd_cgroup


def report(g: Globals, msg: str, level: str = "error") -> None:
    """Reports a command's error the way runc does: a logrus record (text or JSON) in the --log file plus the
    bare message on stderr, or, without --log, the record on stderr."""
    from runtime import logutil
    if logutil.sink() is None:
        logutil.configure(g.log, g.log_format, g.debug)
    if level == "error":
        logutil.error(msg)
    else:
        logutil.emit(level, msg)


def setup_logging(g: Globals) -> None:
    from runtime import logutil
    logutil.configure(g.log, g.log_format, g.debug)
    if g.debug:
        logutil.install_logging_handler()


def guard(g: Globals, fn: Callable[[], int | None], fail_code: int = 1, prefix: str = "") -> int:
    """Runs a verb; HuskError and OSError become a one-line message (after `prefix`) and `fail_code`."""
    try:
        setup_logging(g)
        rc = fn()
        return rc or 0
    except HuskError as e:
        report(g, prefix + str(e))
    except OSError as e:
        report(g, prefix + describe(e))
    return fail_code


# --- the verbs (shared by the fast path and click) ---------------------------------------------------
def cmd_create(g: Globals, container_id: str, bundle: str, console_socket: str | None, pid_file: str | None,
               no_pivot: bool, no_new_keyring: bool, preserve_fds: int) -> int:
    from runtime import lifecycle
    lifecycle.create(g.root, container_id, bundle, console_socket=console_socket, pid_file=pid_file,
                     no_pivot=no_pivot, no_new_keyring=no_new_keyring, preserve_fds=preserve_fds,
                     systemd_cgroup=g.systemd_cgroup)
    return 0


def cmd_start(g: Globals, container_id: str) -> int:
    from runtime import lifecycle
    lifecycle.start(g.root, container_id)
    return 0


def cmd_state(g: Globals, container_id: str) -> int:
    from runtime import lifecycle
    from runtime.state import dumps_json
    sys.stdout.write(dumps_json(lifecycle.state(g.root, container_id), indent=2) + "\n")
    return 0


def cmd_kill(g: Globals, container_id: str, sig: str, all: bool) -> int:
    from runtime import lifecycle
    lifecycle.kill(g.root, container_id, parse_signal(sig), all=all)
    return 0


def cmd_delete(g: Globals, container_id: str, force: bool) -> int:
    from runtime import lifecycle
    from runtime.errors import ContainerNotFound
    try:
        lifecycle.delete(g.root, container_id, force=force)
    except ContainerNotFound:
        if force:
            return 0  # runc: delete --force of a missing container is not an error
        raise
    return 0


def parse_signal(s: str) -> int:
    """runc's syntax (KILL, SIGKILL, 9) and CRI's (SIGRTMIN+3, SIGRTMINPLUS3): runtime/signals.py."""
    from runtime import signals
    try:
        return signals.parse(s)
    except ValueError as e:
        raise HuskError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    from runtime import fastcli
    parsed = fastcli.parse(args)
    if parsed is not None:
        g, verb, kw = parsed
        if verb == "exec":  # runc: a process that could not be started is "exec failed: ...", status 255
            return guard(g, lambda: VERBS[verb](g, **kw), fail_code=255, prefix="exec failed: ")
        return guard(g, lambda: VERBS[verb](g, **kw))
    from runtime import commands
    return commands.run_click(args)


def launch(interpreter: str, protected: str) -> None:
    """The generated `husk` launcher's entry (runtime/launcher.py): after it, sys.argv[0] is the launcher's path.
    `interpreter` is the real interpreter file, `protected` its persistent protected interpreter (the launcher
    execs that one when it is there). As root, makes or repairs it for the next calls when this call did not
    run from a sound one (runtime/exeguard.py; one look at two inodes when it did). Never returns."""
    import gc
    gc.disable()  # a short-lived command: the collector would only run during imports
    if sys.argv[0] == "-c":
        del sys.argv[0]  # the sh launcher's: sys.argv[1] is its path; the #! launcher's script is sys.argv[0]
    if os.geteuid() == 0:
        try:
            ok = False
            if os.readlink("/proc/self/exe") == protected:
                mine, real = os.stat(protected), os.stat(interpreter)
                ok = (mine.st_dev, mine.st_ino) == (real.st_dev, real.st_ino)  # not stale (a replaced interpreter)
        except OSError:
            ok = False
        if not ok:
            from runtime import exeguard
            exeguard.ensure_persistent(interpreter, protected)
    rc = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        pass
    os._exit(rc if isinstance(rc, int) else 1)  # skip interpreter finalization: nothing is left to clean up


def cmd_run(g: Globals, container_id: str, bundle: str, console_socket: str | None, pid_file: str | None,
            detach: bool, keep: bool, no_pivot: bool, no_new_keyring: bool, preserve_fds: int) -> int:
    from runtime import lifecycle
    return lifecycle.run(g.root, container_id, bundle, detach=detach, console_socket=console_socket,
                         pid_file=pid_file, no_pivot=no_pivot, no_new_keyring=no_new_keyring,
                         preserve_fds=preserve_fds, keep=keep, systemd_cgroup=g.systemd_cgroup)


def cmd_exec(g: Globals, container_id: str, process_file: str, console_socket: str | None, pid_file: str | None,
             detach: bool, tty: bool, preserve_fds: int, ignore_paused: bool) -> int:
    """`exec --process FILE`: the JSON is used as given (runc ignores --tty then: the file says terminal)."""
    from runtime import execflags, lifecycle
    process = execflags.load_process_file(process_file)
    rc = lifecycle.exec_process(g.root, container_id, process, console_socket=console_socket, pid_file=pid_file,
                                detach=detach, preserve_fds=preserve_fds, ignore_paused=ignore_paused)
    return 0 if detach else rc


VERBS: "dict[str, Callable[..., int]]" = {
    "create": cmd_create, "start": cmd_start, "state": cmd_state, "kill": cmd_kill, "delete": cmd_delete,
    "run": cmd_run, "exec": cmd_exec,
}


if __name__ == "__main__":
    sys.exit(main())

