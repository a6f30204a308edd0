"""`husk exec`'s flags turned into an OCI process object and sub-cgroup paths, by runc's rules (pure functions).

runc's order: --process FILE is used as given; otherwise the container's own process is the template and the
flags override or extend it. Nothing here touches the container; execute.py runs the result.
"""
from __future__ import annotations

import copy
import os
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

from runtime.errors import HuskError

# --cap adds to these sets; never to inheritable (CVE-2022-29162: runc >= 1.1.2 stopped that), so the ambient
# entry only takes effect where the container's own inheritable set already has the capability
CAP_SETS = ("bounding", "effective", "permitted", "ambient")


def load_process_file(path: str) -> dict[str, Any]:
    """`--process FILE` (or `-` for stdin is not runc's: a path only)."""
    from runtime import jsonload
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise HuskError(f"--process {path}: {e.strerror}") from None
    try:
        proc = jsonload.loads(data)
    except ValueError as e:
        raise HuskError(f"--process {path}: invalid JSON: {e}") from None
    if not isinstance(proc, dict):
        raise HuskError(f"--process {path}: must hold a JSON object (an OCI process)")
    validate(proc)
    return proc


def from_flags(template: dict[str, Any], command: list[str], *, tty: bool = False, cwd: str | None = None,
               env: tuple[str, ...] | list[str] = (), user: str | None = None,
               additional_gids: tuple[int, ...] | list[int] = (), caps: tuple[str, ...] | list[str] = (),
               no_new_privs: bool = False, apparmor: str | None = None,
               process_label: str | None = None) -> dict[str, Any]:
    """The container's process (`template`, not modified) with runc's exec flags applied."""
    if not command:
        raise HuskError("exec: give a command after the container id, or --process FILE")
    p = copy.deepcopy(template) if template else {}
    p["args"] = list(command)
    if cwd:
        p["cwd"] = cwd
    if apparmor:
        p["apparmorProfile"] = apparmor
    if process_label:
        p["selinuxLabel"] = process_label
    if caps:
        sets = p.get("capabilities")
        if not isinstance(sets, dict):
            sets = p["capabilities"] = {}
        for name in caps:
            # as runc (duplicates are harmless: the sets are bit masks)
            for kind in CAP_SETS:
                sets.setdefault(kind, []).append(name)
    p["env"] = list(p.get("env") or []) + list(env)
    p["terminal"] = bool(tty)  # runc: an exec never inherits the container's terminal setting
    if no_new_privs:
        p["noNewPrivileges"] = True
    u = dict(p.get("user") or {})
    u.setdefault("uid", 0)
    u.setdefault("gid", 0)
    if user:
        uid, sep, gid = user.partition(":")
        if sep:
            u["gid"] = _id(gid, "gid", user)
        u["uid"] = _id(uid, "uid", user)
    for g in additional_gids:
        if g < 0:
            raise HuskError(f"--additional-gids: must be a positive number, not {g}")
        u.setdefault("additionalGids", []).append(g)
    p["user"] = u
    validate(p)
    return p


def _id(text: str, what: str, flag: str) -> int:
    try:
        n = int(text, 10)
    except ValueError:
        raise HuskError(f"--user {flag!r}: parsing {text!r} as int for {what} failed") from None
    if not 0 <= n < 2**32:
        raise HuskError(f"--user {flag!r}: {what} {n} is out of range")
    return n


def validate(p: dict[str, Any]) -> None:
    """runc's checks of an exec process before anything starts."""
    cwd = p.get("cwd")
    if not cwd:
        raise HuskError("exec: process.cwd must not be empty")
    if not os.path.isabs(cwd):
        raise HuskError(f"exec: process.cwd {cwd!r} must be an absolute path")
    if not p.get("args"):
        raise HuskError("exec: process.args must not be empty")
    if p.get("selinuxLabel"):
        raise HuskError("exec: an SELinux label is given (--process-label or process.selinuxLabel) but SELinux "
                        "is not supported by husk on this host")


def sub_cgroups(args: tuple[str, ...] | list[str]) -> dict[str, str]:
    """runc's `--cgroup [controller[,controller]:]path` values -> {controller or "": path}."""
    out: dict[str, str] = {}
    for a in args:
        parts = a.split(":")
        if len(parts) > 2:
            raise HuskError(f"invalid --cgroup argument: {a}")
        if len(parts) == 1:
            if len(args) != 1:
                raise HuskError(f"invalid --cgroup argument: {a} (missing <controller>: prefix)")
            out[""] = a
            continue
        for ctrl in parts[0].split(","):
            if not ctrl:
                raise HuskError(f"invalid --cgroup argument: {a} (empty <controller> prefix)")
            if ctrl in out:
                raise HuskError(f"invalid --cgroup argument(s): controller {ctrl} specified multiple times")
            out[ctrl] = parts[1]
    return out


def join_sub(base: str, sub: str) -> str:
    """`sub` below the container's cgroup `base`; a path that leaves it (.., or a sibling with the same prefix)
    is an error."""
    joined = os.path.normpath(os.path.join(base, sub.lstrip("/")))
    if joined != base and not joined.startswith(base.rstrip("/") + "/"):
        raise HuskError(f"--cgroup {sub}: {joined} is not a sub-cgroup of the container's cgroup {base}")
    return joined
