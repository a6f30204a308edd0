"""Reading /proc/<pid>/mountinfo: the one parser of the mount table for the runtime and the layers above, and the
one answer to "which mount holds this path".

Every path and option field comes out unescaped (the kernel writes space, tab, newline and backslash as \\ooo),
so callers compare real paths. Pure string work, no imports beyond os: safe to import on any hot path.
"""
from __future__ import annotations

TYPE_CHECKING = False  # `typing` costs ~4 ms (it imports re): annotations only
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable


def unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as a backslash and three octal digits."""
    if "\\" not in field:
        return field
    out, i = bytearray(), 0
    raw = field.encode(errors="surrogateescape")
    while i < len(raw):
        if raw[i] == 0x5C and len(raw[i + 1:i + 4]) == 3 and raw[i + 1:i + 4].isdigit():
            out.append(int(raw[i + 1:i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return out.decode(errors="surrogateescape")


class Mount:
    """One line of mountinfo (proc(5)), every field unescaped. A plain class: `dataclasses` costs tens of ms.
    The option lists are split (and unescaped) when first asked for: most lookups only need the paths."""
    __slots__ = ("id", "parent", "dev", "root", "point", "_options", "optional", "fstype", "source", "_super")

    def __init__(self, id: int, parent: int, dev: str, root: str, point: str, options: str,
                 optional: list[str], fstype: str, source: str, super_options: str) -> None:
        self.id = id
        self.parent = parent
        self.dev = dev                      # "major:minor"
        self.root = root                    # the directory of the filesystem mounted here ("/" for all of it)
        self.point = point
        self._options = options
        self.optional = optional            # shared:N, master:N, propagate_from:N, unbindable
        self.fstype = fstype
        self.source = source
        self._super = super_options         # as the kernel wrote it (escaped)

    @property
    def options(self) -> list[str]:
        """Per-mount options: rw, nosuid, relatime..."""
        return self._options.split(",")

    @property
    def super_options(self) -> list[str]:
        """Per-superblock options, split on the kernel's commas, then unescaped (an escaped comma stays)."""
        return [unescape(o) for o in self._super.split(",")] if self._super else []

    @property
    def shared(self) -> bool:
        return any(t.startswith("shared:") for t in self.optional)

    @property
    def slave(self) -> bool:
        return any(t.startswith("master:") for t in self.optional)

    def __repr__(self) -> str:
        return f"Mount({self.id} {self.point!r} {self.fstype} from {self.source!r})"


def parse_line(line: str) -> Mount | None:
    """One mountinfo line; None for a blank or malformed one."""
    return _from_fields(line.split())


def _from_fields(f: list[str]) -> Mount | None:
    try:
        sep = 6 if f[6] == "-" else f.index("-", 7)
        root, point, source = f[3], f[4], f[sep + 2] if len(f) > sep + 2 else ""
        return Mount(int(f[0]), int(f[1]), f[2], unescape(root) if "\\" in root else root,
                     unescape(point) if "\\" in point else point, f[5], f[6:sep], unescape(f[sep + 1]),
                     unescape(source) if "\\" in source else source, f[sep + 3] if len(f) > sep + 3 else "")
    except (ValueError, IndexError):
        return None


def parse(text: "str | Iterable[str]") -> list[Mount]:
    """Every mount of mountinfo text (or of its lines), in the kernel's order (mount order)."""
    lines = text.splitlines() if isinstance(text, str) else text
    return [m for m in map(parse_line, lines) if m is not None]


def read(pid: "int | str" = "self", fstypes: "tuple[str, ...] | None" = None) -> list[Mount]:
    """The mount table of `pid`'s mount namespace, as that process sees it (OSError if it cannot be read);
    with `fstypes`, only mounts of those types (the others are not decoded: hosts with many mounts)."""
    with open(f"/proc/{pid}/mountinfo") as f:
        if fstypes is None:
            return parse(f)
        return [m for m in map(parse_line, (ln for ln in f if ln.partition(" - ")[2].split(" ", 1)[0] in fstypes))
                if m is not None]


def _read_points(pid: "int | str", keep: "Callable[[str], bool]") -> tuple[list[Mount], set[int]]:
    """The mounts whose (unescaped) mount point `keep` accepts, and the ids of all: only those are decoded."""
    out: list[Mount] = []
    ids: set[int] = set()
    with open(f"/proc/{pid}/mountinfo") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 5:
                continue
            point = fields[4]
            if keep(unescape(point) if "\\" in point else point):
                m = _from_fields(fields)
                if m is not None:
                    out.append(m)
                    ids.add(m.id)
            elif fields[0].isdigit():
                ids.add(int(fields[0]))
    return out, ids


def mount_ids(pid: "int | str" = "self") -> set[int]:
    """Only the mount ids of `pid`'s namespace: no field is decoded (the exec path's check, exeguard.py)."""
    with open(f"/proc/{pid}/mountinfo", "rb") as f:
        return {int(line.split(b" ", 1)[0]) for line in f if line.strip()}


def _holds(point: str, path: str) -> bool:
    return path == point or path.startswith(point.rstrip("/") + "/")


def mount_of(path: str, mounts: list[Mount] | None = None) -> Mount | None:
    """The mount that holds `path` (absolute, symlinks already resolved): the one a lookup of `path` ends on.

    The mount tree is walked from the root as the kernel resolves a path: at each mount, the first of its
    children met along `path` (the shortest mount point, the latest of equals) is crossed, so an overmount
    (a child at its parent's own mount point) wins over its parent and a mount hidden under a later, shorter
    one is never chosen. Tables without a tree (no root mount found) fall back to the longest mount point.
    Without `mounts`, this process's table is read, decoding only the lines whose mount point holds `path`."""
    if mounts is None:
        cands, ids = _read_points("self", lambda point: _holds(point, path))
    else:
        cands, ids = [m for m in mounts if _holds(m.point, path)], {m.id for m in mounts}
    # only mounts whose point holds `path` can be on the walk: a mount's point lies below its parent's
    cur = None
    for m in cands:
        if m.point == "/" and m.parent not in ids:
            cur = m
    if cur is None:
        best = None
        for m in cands:
            if best is None or len(m.point) >= len(best.point):
                best = m
        return best
    children: dict[int, list[Mount]] = {}
    for m in cands:
        if m.parent != m.id:
            children.setdefault(m.parent, []).append(m)
    seen = {cur.id}
    while True:
        nxt = None
        for k in children.get(cur.id, ()):
            if k.id not in seen and (nxt is None or len(k.point) <= len(nxt.point)):
                nxt = k
        if nxt is None:
            return cur
        seen.add(nxt.id)
        cur = nxt


def mount_at(path: str, mounts: list[Mount] | None = None) -> Mount | None:
    """The visible mount whose mount point is exactly `path` (the topmost when overmounted), else None."""
    m = mount_of(path, mounts)
    return m if m is not None and m.point == path else None


def mounts_under(path: str, mounts: list[Mount] | None = None) -> list[Mount]:
    """Every mount at or below `path`, hidden ones included, in the table's order."""
    if mounts is None:
        return _read_points("self", lambda point: _holds(path, point))[0]
    return [m for m in mounts if _holds(path, m.point)]
