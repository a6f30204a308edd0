"""Users and groups of an image: /etc/passwd and /etc/group read inside a rootfs without escaping it.

Resolves a CRI run_as_user / run_as_username / image USER into uid, gid and supplemental groups. Reads
files only; symlinks in the rootfs are resolved as if the rootfs were /.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


class UserError(ValueError):
    """The user or group cannot be resolved; the message says which and where it was looked up."""


@dataclass(frozen=True)
class PasswdEntry:
    name: str
    uid: int
    gid: int
    home: str = "/"


@dataclass(frozen=True)
class GroupEntry:
    name: str
    gid: int
    members: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResolvedUser:
    uid: int
    gid: int
    additional_gids: tuple[int, ...] = ()
    username: str = ""


def secure_join(root: str, path: str, max_links: int = 40) -> str:
    """`path` inside `root`, following symlinks with `root` as / (absolute links and .. stay inside)."""
    root = os.path.realpath(root)
    parts = [p for p in path.split("/") if p not in ("", ".")]
    resolved: list[str] = []
    links = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = os.path.join(root, *resolved, part)
        try:
            target = os.readlink(candidate)
        except OSError:
            resolved.append(part)
            continue
        links += 1
        if links > max_links:
            raise UserError(f"{path}: too many levels of symbolic links in {root}")
        if target.startswith("/"):
            resolved = []
        parts = [p for p in target.split("/") if p not in ("", ".")] + parts
    return os.path.join(root, *resolved)


def _read(rootfs: str, path: str) -> list[list[str]]:
    try:
        with open(secure_join(rootfs, path), encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n").split(":") for line in f if line.strip() and not line.startswith("#")]
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return []


def read_passwd(rootfs: str) -> list[PasswdEntry]:
    out = []
    for f in _read(rootfs, "/etc/passwd"):
        if len(f) >= 4 and f[2].isdigit() and f[3].isdigit():
            out.append(PasswdEntry(f[0], int(f[2]), int(f[3]), f[5] if len(f) > 5 and f[5] else "/"))
    return out


def read_group(rootfs: str) -> list[GroupEntry]:
    out = []
    for f in _read(rootfs, "/etc/group"):
        if len(f) >= 3 and f[2].isdigit():
            members = tuple(m for m in (f[3].split(",") if len(f) > 3 else []) if m)
            out.append(GroupEntry(f[0], int(f[2]), members))
    return out


def resolve(rootfs: str, user: str = "", uid: int | None = None, gid: int | None = None,
            extra_groups: tuple[int, ...] = (), merge_image_groups: bool = True) -> ResolvedUser:
    """uid/gid given as numbers win; otherwise `user` ("name", "uid", "name:group", "uid:gid") is looked up in
    the rootfs. A numeric user missing from /etc/passwd is fine (gid 0); a missing name is an error.
    Supplemental groups: the image's /etc/group memberships of the user (unless merge is off) plus
    `extra_groups`, without duplicates."""
    passwd = read_passwd(rootfs)
    group_spec = ""
    entry: PasswdEntry | None = None
    if uid is None:
        name, _, group_spec = (user or "0").partition(":")
        name = name or "0"
        if name.isdigit():
            uid = int(name)
            entry = next((p for p in passwd if p.uid == uid), None)
        else:
            entry = next((p for p in passwd if p.name == name), None)
            if entry is None:
                raise UserError(f"user {name!r} not found in the image's /etc/passwd")
            uid = entry.uid
    else:
        entry = next((p for p in passwd if p.uid == uid), None)
    groups = read_group(rootfs) if (group_spec and not group_spec.isdigit()) or merge_image_groups else []
    if gid is None:
        if group_spec:
            if group_spec.isdigit():
                gid = int(group_spec)
            else:
                g = next((g for g in groups if g.name == group_spec), None)
                if g is None:
                    raise UserError(f"group {group_spec!r} not found in the image's /etc/group")
                gid = g.gid
        else:
            gid = entry.gid if entry else 0
    additional: list[int] = []
    if merge_image_groups and entry is not None:
        additional += [g.gid for g in groups if entry.name in g.members]
    additional += list(extra_groups)
    seen: set[int] = set()
    unique = tuple(g for g in additional if not (g in seen or seen.add(g)))
    return ResolvedUser(uid, gid, unique, entry.name if entry else "")
