"""Builds the guest's initramfs: a newc cpio archive with static busybox, the init script and kernel modules.

Owns module dependency resolution (from each .ko's .modinfo section: Debian's package ships no modules.dep)
and the cpio writer. Stdlib only; never needs root (device nodes are written as archive entries).
"""
from __future__ import annotations

import stat
import struct
from dataclasses import dataclass
from pathlib import Path


# --- module metadata ---------------------------------------------------------------------------------------------
def _elf_section(data: bytes, name: bytes) -> bytes:
    """The contents of the named section of a little-endian ELF64 file (empty if absent)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i: int) -> tuple[int, int, int]:
        base = shoff + i * shentsize
        sh_name = struct.unpack_from("<I", data, base)[0]
        sh_offset, sh_size = struct.unpack_from("<QQ", data, base + 24)
        return sh_name, sh_offset, sh_size

    _, str_off, str_size = header(shstrndx)
    names = data[str_off:str_off + str_size]
    for i in range(shnum):
        sh_name, off, size = header(i)
        end = names.index(b"\0", sh_name)
        if names[sh_name:end] == name:
            return data[off:off + size]
    return b""


def modinfo(path: Path) -> dict[str, str]:
    """The key=value pairs of a module's .modinfo section (later duplicates, e.g. several `alias`, are dropped)."""
    info: dict[str, str] = {}
    for entry in _elf_section(path.read_bytes(), b".modinfo").split(b"\0"):
        if b"=" in entry:
            key, _, value = entry.partition(b"=")
            info.setdefault(key.decode(), value.decode(errors="replace"))
    return info


def _norm(name: str) -> str:
    return name.replace("-", "_")


def module_index(modules_dir: Path) -> dict[str, Path]:
    """Module name (dashes as underscores, as the kernel names them) -> .ko path, for every module under kernel/."""
    index: dict[str, Path] = {}
    for ko in sorted(modules_dir.glob("kernel/**/*.ko")):
        index[_norm(ko.name[:-3])] = ko
    return index


def builtin_modules(modules_dir: Path) -> set[str]:
    names: set[str] = set()
    builtin = modules_dir / "modules.builtin"
    if builtin.exists():
        for line in builtin.read_text().split():
            names.add(_norm(Path(line).name.removesuffix(".ko")))
    return names


def resolve_modules(wanted: list[str], index: dict[str, Path], builtin: set[str],
                    depends: dict[str, list[str]] | None = None) -> list[str]:
    """`wanted` plus everything they depend on, each after its dependencies (insmod order); built-ins are skipped.

    `depends` may be given (tests); otherwise it is read from each module's .modinfo.
    """
    order: list[str] = []
    visiting: set[str] = set()

    def deps_of(name: str) -> list[str]:
        if depends is not None:
            return depends.get(name, [])
        dep = modinfo(index[name]).get("depends", "")
        return [_norm(d) for d in dep.split(",") if d]

    def visit(name: str, chain: tuple[str, ...]) -> None:
        name = _norm(name)
        if name in order or name in builtin:
            return
        if name in visiting:
            raise ValueError(f"module dependency cycle: {' -> '.join(chain + (name,))}")
        if name not in index:
            raise ValueError(f"module {name!r} (needed by {' -> '.join(chain) or 'the VM'}) is neither in the "
                             f"kernel package nor built in")
        visiting.add(name)
        for dep in deps_of(name):
            visit(dep, chain + (name,))
        visiting.discard(name)
        order.append(name)

    for name in wanted:
        visit(name, ())
    return order


# --- cpio (newc) -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    name: str              # path inside the archive, without a leading slash
    mode: int              # full st_mode (type bits included)
    data: bytes = b""      # file contents, or the target of a symlink
    rdev: tuple[int, int] = (0, 0)


def file_entry(name: str, data: bytes, perm: int = 0o644) -> Entry:
    return Entry(name, stat.S_IFREG | perm, data)


def dir_entry(name: str, perm: int = 0o755) -> Entry:
    return Entry(name, stat.S_IFDIR | perm)


def symlink_entry(name: str, target: str) -> Entry:
    return Entry(name, stat.S_IFLNK | 0o777, target.encode())


def chardev_entry(name: str, major: int, minor: int, perm: int = 0o600) -> Entry:
    return Entry(name, stat.S_IFCHR | perm, b"", (major, minor))


def _pad4(n: int) -> bytes:
    return b"\0" * (-n % 4)


def write_cpio(entries: list[Entry]) -> bytes:
    """A newc ("070701") archive, owned by root, mtime 0 so that equal inputs give equal bytes."""
    out = bytearray()
    for ino, e in enumerate(entries + [Entry("TRAILER!!!", 0)], start=1):
        name = e.name.encode() + b"\0"
        fields = (ino, e.mode, 0, 0, 2 if stat.S_ISDIR(e.mode) else 1, 0, len(e.data),
                  0, 0, e.rdev[0], e.rdev[1], len(name), 0)
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        out += header + name
        out += _pad4(len(header) + len(name))
        out += e.data + _pad4(len(e.data))
    return bytes(out)


def read_cpio(blob: bytes) -> list[Entry]:
    """Parses a newc archive (used by the tests and to inspect a cached image)."""
    entries: list[Entry] = []
    pos = 0
    while True:
        if blob[pos:pos + 6] != b"070701":
            raise ValueError(f"bad cpio magic at offset {pos}")
        f = [int(blob[pos + 6 + 8 * i: pos + 14 + 8 * i], 16) for i in range(13)]
        mode, filesize, rmaj, rmin, namesize = f[1], f[6], f[9], f[10], f[11]
        name_start = pos + 110
        name = blob[name_start:name_start + namesize - 1].decode()
        data_start = name_start + namesize + (-(110 + namesize) % 4)
        data = blob[data_start:data_start + filesize]
        pos = data_start + filesize + (-filesize % 4)
        if name == "TRAILER!!!":
            return entries
        entries.append(Entry(name, mode, data, (rmaj, rmin)))


def build(busybox: Path, init_script: str, modules: list[tuple[str, Path]],
          extra_files: dict[str, tuple[bytes, int]] | None = None) -> bytes:
    """The whole initramfs: /init (the script), /bin/busybox, the modules (name, .ko path; in load order) as
    /lib/modules/<name>.ko listed in /lib/modules/load-order, /dev/console, and `extra_files`
    (archive path -> (contents, permission bits); their missing parent directories are added)."""
    entries = [dir_entry(d) for d in ("bin", "dev", "proc", "sys", "run", "tmp", "mnt", "newroot", "lib",
                                      "lib/modules")]
    entries.append(chardev_entry("dev/console", 5, 1))
    entries.append(chardev_entry("dev/null", 1, 3, 0o666))
    entries.append(file_entry("bin/busybox", busybox.read_bytes(), 0o755))
    entries.append(symlink_entry("bin/sh", "busybox"))
    entries.append(file_entry("init", init_script.encode(), 0o755))
    for name, path in modules:
        entries.append(file_entry(f"lib/modules/{name}.ko", path.read_bytes()))
    entries.append(file_entry("lib/modules/load-order", "".join(f"{n}\n" for n, _ in modules).encode()))
    have = {e.name for e in entries}
    for path, (data, perm) in sorted((extra_files or {}).items()):
        parts = path.split("/")[:-1]      # the kernel's unpacker makes no missing parent directory
        for i in range(1, len(parts) + 1):
            parent = "/".join(parts[:i])
            if parent not in have:
                have.add(parent)
                entries.append(dir_entry(parent))
        entries.append(file_entry(path, data, perm))
    return write_cpio(entries)
