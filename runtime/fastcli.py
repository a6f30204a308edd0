"""A stdlib parser for exactly runc's flags of the per-container verbs (create, start, state, kill, delete, run,
and `exec --process FILE`).

`parse` returns (Globals, verb, kwargs) or None for anything else (another command, --help, an unknown or
unusual flag), and then the click CLI handles the command line. tests/unit/test_fastcli.py checks that both
parsers agree on the command lines containerd and podman send.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

from runtime.cli import DEFAULT_ROOT, Globals

# flag -> (attribute, takes a value)
GLOBAL_FLAGS = {"--root": ("root", True), "--log": ("log", True), "--log-format": ("log_format", True),
                "--debug": ("debug", False), "--systemd-cgroup": ("systemd_cgroup", False)}
VERB_FLAGS: dict[str, dict[str, tuple[str, bool]]] = {
    "create": {"--bundle": ("bundle", True), "-b": ("bundle", True), "--console-socket": ("console_socket", True),
               "--pid-file": ("pid_file", True), "--no-pivot": ("no_pivot", False),
               "--no-new-keyring": ("no_new_keyring", False), "--preserve-fds": ("preserve_fds", True)},
    "start": {},
    "state": {},
    "kill": {"--all": ("all", False), "-a": ("all", False)},
    "delete": {"--force": ("force", False), "-f": ("force", False)},
    # only the form containerd's shim and conmon send (`exec --process FILE ... ID`); a command line is click's
    "exec": {"--process": ("process_file", True), "-p": ("process_file", True), "--detach": ("detach", False),
             "-d": ("detach", False), "--pid-file": ("pid_file", True), "--console-socket": ("console_socket", True),
             "--tty": ("tty", False), "-t": ("tty", False), "--preserve-fds": ("preserve_fds", True),
             "--ignore-paused": ("ignore_paused", False)},
    "run": {"--bundle": ("bundle", True), "-b": ("bundle", True), "--console-socket": ("console_socket", True),
            "--pid-file": ("pid_file", True), "--detach": ("detach", False), "-d": ("detach", False),
            "--keep": ("keep", False), "--no-pivot": ("no_pivot", False),
            "--no-new-keyring": ("no_new_keyring", False), "--preserve-fds": ("preserve_fds", True)},
}
DEFAULTS: dict[str, dict[str, Any]] = {
    "create": {"bundle": ".", "console_socket": None, "pid_file": None, "no_pivot": False,
               "no_new_keyring": False, "preserve_fds": 0},
    "start": {}, "state": {}, "kill": {"all": False}, "delete": {"force": False},
    "run": {"bundle": ".", "console_socket": None, "pid_file": None, "detach": False, "keep": False,
            "no_pivot": False, "no_new_keyring": False, "preserve_fds": 0},
    "exec": {"process_file": None, "console_socket": None, "pid_file": None, "detach": False, "tty": False,
             "preserve_fds": 0, "ignore_paused": False},
}
POSITIONAL = {"create": 1, "start": 1, "state": 1, "kill": 2, "delete": 1, "run": 1, "exec": 1}


def _take(args: list[str], i: int, table: dict[str, tuple[str, bool]], out: dict[str, Any]) -> int | None:
    """Consumes the flag at args[i] into `out`; returns the next index, or None if it is not ours."""
    a = args[i]
    name, eq, value = a.partition("=")
    spec = table.get(name)
    if spec is None:
        return None
    attr, takes = spec
    if not takes:
        if eq:
            return None  # --flag=value for a boolean: leave the unusual spelling to click
        out[attr] = True
        return i + 1
    if eq:
        out[attr] = value
        return i + 1
    if i + 1 >= len(args):
        return None
    out[attr] = args[i + 1]
    return i + 2


def parse(args: list[str]) -> tuple[Globals, str, dict[str, Any]] | None:
    g: dict[str, Any] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] == "--":
            return None
        nxt = _take(args, i, GLOBAL_FLAGS, g)
        if nxt is None:
            return None
        i = nxt
    if i >= len(args):
        return None
    verb = args[i]
    if verb not in VERB_FLAGS:
        return None
    i += 1
    kw: dict[str, Any] = dict(DEFAULTS[verb])
    pos: list[str] = []
    while i < len(args):
        a = args[i]
        if a == "--":
            pos.extend(args[i + 1:])
            break
        if verb == "exec" and pos:
            return None  # runc reads everything after exec's container id as the command
        if a.startswith("-") and len(a) > 1 and not (verb == "kill" and len(pos) == 1 and _looks_signal(a)):
            nxt = _take(args, i, VERB_FLAGS[verb], kw)
            if nxt is None:
                return None
            i = nxt
            continue
        pos.append(a)
        i += 1
    need = POSITIONAL[verb]
    if verb == "kill":
        if not 1 <= len(pos) <= 2:
            return None
        kw["sig"] = pos[1] if len(pos) == 2 else "SIGTERM"
    elif len(pos) != need:
        return None
    kw["container_id"] = pos[0]
    if verb == "exec" and kw["process_file"] is None:
        return None
    if verb in ("create", "run", "exec"):
        try:
            kw["preserve_fds"] = int(kw["preserve_fds"])
        except ValueError:
            return None
    glob = Globals(root=g.get("root", DEFAULT_ROOT), log=g.get("log"), log_format=g.get("log_format", "text"),
                   debug=bool(g.get("debug")), systemd_cgroup=bool(g.get("systemd_cgroup")))
    if glob.log_format not in ("text", "json"):
        return None
    return glob, verb, kw


def _looks_signal(a: str) -> bool:
    return a[1:].isdigit()
