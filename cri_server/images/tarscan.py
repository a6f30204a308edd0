"""Safety rules for layer members, and a streaming tar header scanner that enforces them before GNU tar sees a byte.

Rules (`LayerRules`): no absolute names, no `..`, nothing written, linked or whited-out through a symlink created
earlier in the same layer (a layer is always extracted into an empty directory, so those are the only symlinks
there). The scanner (`TarScanner`) parses ustar/GNU/pax headers from the uncompressed stream in any chunking and
rejects anything it cannot interpret exactly as GNU tar would, so the checked members are the extracted ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import InvalidLayer, UnsafeLayer

BLOCK = 512

# typeflags
REG, AREG, CONTTYPE = b"0", b"\x00", b"7"
LNK, SYM, CHR, BLK, DIR, FIFO = b"1", b"2", b"3", b"4", b"5", b"6"
PAX_X, PAX_G, GNU_LONGNAME, GNU_LONGLINK = b"x", b"g", b"L", b"K"
FILE_TYPES = (REG, AREG, CONTTYPE)
HEADER_ONLY_TYPES = (LNK, SYM, CHR, BLK, DIR, FIFO)
EXTENSION_TYPES = (PAX_X, PAX_G, GNU_LONGNAME, GNU_LONGLINK)
MAX_EXTENSION = 1 << 20  # a pax or long-name record larger than this is not a real layer

WHITEOUT_PREFIX = ".wh."
WHITEOUT_META_PREFIX = ".wh..wh."
WHITEOUT_OPAQUE = ".wh..wh..opq"


def clean_name(name: str, layer: str, what: str = "member") -> str:
    """Normalise a member name to `a/b/c` ('' for the layer root); refuse absolute names and `..`."""
    if "\x00" in name:
        raise UnsafeLayer(layer, name, f"{what} name contains a NUL byte")
    if name.startswith("/"):
        raise UnsafeLayer(layer, name, f"absolute {what} path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeLayer(layer, name, f"{what} path contains '..'")
    return "/".join(parts)


@dataclass
class LayerRules:
    """Per-layer state of the safety rules, and what the whiteout pass needs afterwards."""

    layer: str
    symlinks: set[str] = field(default_factory=set)
    whiteouts: list[str] = field(default_factory=list)  # paths of `.wh.<name>` members
    opaques: list[str] = field(default_factory=list)  # directories that had `.wh..wh..opq`
    meta: list[str] = field(default_factory=list)  # other `.wh..wh.*` (aufs bookkeeping), removed afterwards
    members: int = 0

    def _through_symlink(self, path: str, raw: str, what: str) -> None:
        if not self.symlinks:
            return
        i = path.find("/")
        while i != -1:
            if path[:i] in self.symlinks:
                raise UnsafeLayer(self.layer, raw, f"{what} goes through symlink {path[:i]!r} in the same layer")
            i = path.find("/", i + 1)

    def check(self, raw_name: str, typeflag: bytes, raw_link: str = "") -> str:
        """Check one member; return its clean name. Raises UnsafeLayer."""
        self.members += 1
        name = clean_name(raw_name, self.layer)
        self._through_symlink(name, raw_name, "path")
        if typeflag == LNK:
            target = clean_name(raw_link, self.layer, "hard link target")
            if not target:
                raise UnsafeLayer(self.layer, raw_name, "hard link to the layer root")
            self._through_symlink(target, raw_name, f"hard link target {raw_link!r}")
            if target == name:
                raise UnsafeLayer(self.layer, raw_name, "hard link to itself")
        if not name:
            if typeflag != DIR:
                raise UnsafeLayer(self.layer, raw_name, "the layer root must be a directory")
            return name
        if typeflag == SYM:
            self.symlinks.add(name)
        elif name in self.symlinks:
            self.symlinks.discard(name)  # tar replaces the symlink itself; nothing is written through it
        base = name.rsplit("/", 1)[-1]
        if base.startswith(WHITEOUT_PREFIX):
            if base == WHITEOUT_OPAQUE:
                self.opaques.append(name.rpartition("/")[0])
            elif base.startswith(WHITEOUT_META_PREFIX):
                self.meta.append(name)
            elif base == WHITEOUT_PREFIX:
                raise UnsafeLayer(self.layer, raw_name, "whiteout without a name")
            else:
                self.whiteouts.append(name)
        return name


def _octal(field_: bytes, what: str, layer: str) -> int:
    if field_ and field_[0] & 0x80:
        if field_[0] != 0x80:
            raise InvalidLayer(layer, f"negative base-256 {what} in tar header")
        return int.from_bytes(field_[1:], "big")
    s = field_.split(b"\x00", 1)[0].strip(b" ")
    if not s:
        return 0
    try:
        return int(s, 8)
    except ValueError:
        raise InvalidLayer(layer, f"bad {what} {s!r} in tar header") from None


def _cstr(field_: bytes) -> bytes:
    return field_.split(b"\x00", 1)[0]


def _decode(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def parse_pax(data: bytes, layer: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    pos = 0
    n = len(data)
    while pos < n:
        if data[pos] == 0:  # some writers pad the record with NULs
            break
        sp = data.find(b" ", pos)
        if sp == -1:
            raise InvalidLayer(layer, "malformed pax record (no length)")
        try:
            length = int(data[pos:sp])
        except ValueError:
            raise InvalidLayer(layer, "malformed pax record length") from None
        if length <= sp - pos + 1 or pos + length > n or data[pos + length - 1:pos + length] != b"\n":
            raise InvalidLayer(layer, "malformed pax record")
        rec = data[sp + 1:pos + length - 1]
        key, eq, val = rec.partition(b"=")
        if not eq:
            raise InvalidLayer(layer, "malformed pax record (no '=')")
        out[key.decode("utf-8", "replace")] = val
        pos += length
    return out


@dataclass(frozen=True)
class Member:
    name: str
    typeflag: bytes
    linkname: str
    size: int
    mode: int
    uid: int
    gid: int
    pax: dict[str, bytes]


class TarScanner:
    """Feed uncompressed tar bytes; every member header is checked before `feed` returns.

    `feed(chunk)` returns how many bytes of `chunk` belong to the archive up to and including its end marker: the
    caller forwards exactly those to the extractor, so a header is never seen by tar before it was checked here,
    and nothing after the end marker is seen at all.
    """

    def __init__(self, rules: LayerRules, on_member=None, on_pax=None) -> None:  # type: ignore[no-untyped-def]
        """on_member(Member) sees every member; on_pax(name, pax) only members with pax records (cheaper)."""
        self.rules = rules
        self.layer = rules.layer
        self.on_member = on_member
        self.on_pax = on_pax
        self._buf = bytearray()  # partial header or extension record
        self._skip = 0  # data + padding bytes left to skip
        self._ext_type: bytes | None = None  # collecting an extension record into _buf
        self._ext_len = 0
        self._ext_padded = 0
        self._long_name: str | None = None
        self._long_link: str | None = None
        self._pax: dict[str, bytes] = {}
        self._gpax: dict[str, bytes] = {}
        self.ended = False
        self.data_bytes = 0
        self.offset = 0

    def feed(self, chunk: bytes | memoryview) -> int:
        if self.ended:
            return 0
        mv = memoryview(chunk)
        n = len(mv)
        pos = 0
        while pos < n:
            if self._skip:
                step = min(self._skip, n - pos)
                self._skip -= step
                pos += step
                continue
            if self._ext_type is not None:
                want = self._ext_padded - len(self._buf)
                take = min(want, n - pos)
                self._buf += mv[pos:pos + take]
                pos += take
                if len(self._buf) == self._ext_padded:
                    self._finish_extension()
                continue
            want = BLOCK - len(self._buf)
            take = min(want, n - pos)
            self._buf += mv[pos:pos + take]
            pos += take
            if len(self._buf) == BLOCK:
                block = bytes(self._buf)
                self._buf.clear()
                if self._header(block):
                    self.ended = True
                    self.offset += pos
                    return pos
        self.offset += n
        return n

    def finish(self) -> None:
        """Call at EOF: a stream may end without the end marker, but not inside a header or a member."""
        if self.ended:
            return
        if self._buf or self._skip or self._ext_type is not None:
            raise InvalidLayer(self.layer, f"truncated tar stream at offset {self.offset}")
        if self._long_name is not None or self._long_link is not None or self._pax:
            raise InvalidLayer(self.layer, "tar stream ends after an extension header")

    def _header(self, block: bytes) -> bool:
        """Process one header block; True when it is the end-of-archive marker."""
        if block.count(0) == BLOCK:
            # GNU tar stops at the first zero block (a second one, or a lone zero block warning); we stop
            # forwarding here so it can never read anything after it.
            return True
        stored = _octal(block[148:156], "checksum", self.layer)
        unsigned = sum(block) - sum(block[148:156]) + 8 * 32
        if stored != unsigned:
            # Some old writers summed signed chars; tar accepts either.
            signed = unsigned - 256 * sum(1 for i, b in enumerate(block) if b > 127 and not 148 <= i < 156)
            if stored != signed:
                raise InvalidLayer(self.layer, f"bad tar header checksum at offset {self.offset}")
        typeflag = block[156:157]
        size = _octal(block[124:136], "size", self.layer)
        if typeflag in EXTENSION_TYPES:
            if size > MAX_EXTENSION:
                raise InvalidLayer(self.layer, f"tar extension record of {size} bytes")
            if (typeflag == GNU_LONGNAME and self._long_name is not None) or \
                    (typeflag == GNU_LONGLINK and self._long_link is not None) or (typeflag == PAX_X and self._pax):
                raise InvalidLayer(self.layer, "repeated tar extension header for one member")
            self._ext_type = typeflag
            self._ext_len = size
            self._ext_padded = (size + BLOCK - 1) // BLOCK * BLOCK
            if self._ext_padded == 0:
                self._finish_extension()
            return False
        magic = block[257:263]
        name_b = _cstr(block[0:100])
        if magic == b"ustar\x00":
            prefix = _cstr(block[345:500])
            if prefix:
                name_b = prefix + b"/" + name_b
        elif magic != b"ustar ":
            if magic.strip(b"\x00"):
                raise InvalidLayer(self.layer, f"unknown tar header magic {magic!r}")
        link_b = _cstr(block[157:257])
        pax = {**self._gpax, **self._pax}
        name = _decode(name_b)
        link = _decode(link_b)
        if self._long_name is not None:
            name = self._long_name
        if self._long_link is not None:
            link = self._long_link
        if "path" in pax:
            pname = _decode(pax["path"])
            if self._long_name is not None and pname != self._long_name:
                raise InvalidLayer(self.layer, "member has both a GNU long name and a different pax path")
            name = pname
        if "linkpath" in pax:
            plink = _decode(pax["linkpath"])
            if self._long_link is not None and plink != self._long_link:
                raise InvalidLayer(self.layer, "member has both a GNU long link and a different pax linkpath")
            link = plink
        if "GNU.sparse.name" in pax:
            name = _decode(pax["GNU.sparse.name"])
        if "size" in pax:
            try:
                size = int(pax["size"])
            except ValueError:
                raise InvalidLayer(self.layer, f"bad pax size for {name!r}") from None
            if size < 0:
                raise InvalidLayer(self.layer, f"negative pax size for {name!r}")
        self._long_name = self._long_link = None
        self._pax = {}
        if typeflag in HEADER_ONLY_TYPES:
            if size:
                raise InvalidLayer(self.layer, f"member {name!r} of type {typeflag!r} carries {size} bytes of data")
        elif typeflag not in FILE_TYPES:
            raise InvalidLayer(self.layer, f"member {name!r}: unsupported tar entry type {typeflag!r}")
        self.rules.check(name, typeflag, link)
        if self.on_pax is not None and pax:
            self.on_pax(name, pax)
        if self.on_member is not None:
            self.on_member(Member(name, typeflag, link, size, _octal(block[100:108], "mode", self.layer),
                                  _octal(block[108:116], "uid", self.layer),
                                  _octal(block[116:124], "gid", self.layer), pax))
        self.data_bytes += size
        self._skip = (size + BLOCK - 1) // BLOCK * BLOCK
        return False

    def _finish_extension(self) -> None:
        data = bytes(self._buf[:self._ext_len])
        self._buf.clear()
        t = self._ext_type
        self._ext_type = None
        if t == GNU_LONGNAME:
            self._long_name = _decode(_cstr(data))
        elif t == GNU_LONGLINK:
            self._long_link = _decode(_cstr(data))
        elif t == PAX_X:
            self._pax = parse_pax(data, self.layer)
        else:
            g = parse_pax(data, self.layer)
            bad = {"path", "linkpath", "size", "GNU.sparse.name"} & g.keys()
            if bad:
                raise InvalidLayer(self.layer, f"global pax header sets {sorted(bad)[0]!r} for every member")
            self._gpax.update(g)
