"""The streaming tar header scanner and the layer safety rules (no extraction here)."""
from __future__ import annotations

import io
import tarfile

import pytest

from cri_server.images.errors import InvalidLayer, UnsafeLayer
from cri_server.images.tarscan import LayerRules, TarScanner, clean_name


def _tar(members: list[tuple[str, str, bytes]], fmt: int = tarfile.PAX_FORMAT, uid: int = 0) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, kind, data in members:
            ti = tarfile.TarInfo(name)
            ti.uid = uid
            if kind == "dir":
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            elif kind == "symlink":
                ti.type, ti.linkname = tarfile.SYMTYPE, data.decode()
                tf.addfile(ti)
            elif kind == "hardlink":
                ti.type, ti.linkname = tarfile.LNKTYPE, data.decode()
                tf.addfile(ti)
            else:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _scan(raw: bytes, chunk: int) -> tuple[list[str], int, LayerRules]:
    names: list[str] = []
    rules = LayerRules("L")
    sc = TarScanner(rules, lambda m: names.append(m.name))
    forwarded = 0
    for i in range(0, len(raw), chunk):
        forwarded += sc.feed(raw[i:i + chunk])
    sc.finish()
    return names, forwarded, rules


LONG = "d/" + "x" * 150 + "/" + "y" * 120


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
@pytest.mark.parametrize("chunk", [1, 7, 511, 512, 513, 4096, 1 << 20])
def test_chunking_and_formats(fmt, chunk):
    members = [("d", "dir", b""), ("d/a", "file", b"hello" * 300), ("d/l", "symlink", b"a"),
               ("d/h", "hardlink", b"d/a"), ("d/.wh.gone", "file", b""), ("d/.wh..wh..opq", "file", b""),
               (".wh..wh.plnk", "dir", b"")]
    if fmt != tarfile.USTAR_FORMAT:
        members.append((LONG, "file", b"long"))
    raw = _tar(members, fmt, uid=3 if fmt == tarfile.USTAR_FORMAT else 10**9)
    names, forwarded, rules = _scan(raw, chunk)
    assert [n.rstrip("/") for n in names] == [m[0] for m in members]
    # forwarding stops with the first zero block: the record padding after it is never passed on
    assert forwarded % 512 == 0 and forwarded < len(raw)
    assert rules.whiteouts == ["d/.wh.gone"] and rules.opaques == ["d"] and rules.meta == [".wh..wh.plnk"]
    assert rules.symlinks == {"d/l"}


def test_forwarding_stops_at_end_marker():
    good = _tar([("a", "file", b"1")])
    tail = b"JUNK" * 1000
    rules = LayerRules("L")
    sc = TarScanner(rules)
    n = sc.feed(good + tail)
    end = good.index(b"\0" * 1024, 1024)  # the first zero block after the member's data
    assert n == end + 512 and sc.ended and sc.feed(b"more") == 0


@pytest.mark.parametrize("name,msg", [("/etc/passwd", "absolute"), ("../x", "'..'"), ("a/../../x", "'..'"),
                                      ("a\x00b", "NUL")])
def test_clean_name_refuses(name, msg):
    with pytest.raises(UnsafeLayer, match=msg):
        clean_name(name, "L")


def test_clean_name_normalises():
    assert clean_name("./a//b/./c/", "L") == "a/b/c"
    assert clean_name("./", "L") == ""


@pytest.mark.parametrize("members,msg", [
    ([("s", "symlink", b"/etc"), ("s/passwd", "file", b"x")], "through symlink 's'"),
    ([("s", "symlink", b"."), ("s/s/x", "file", b"x")], "through symlink"),
    ([("s", "symlink", b"/"), ("h", "hardlink", b"s/etc/shadow")], "hard link target"),
    ([("h", "hardlink", b"../x")], "'..'"),
    ([("h", "hardlink", b"h")], "itself"),
    ([("a", "file", b""), ("./", "file", b"")], "root must be a directory"),
    ([("d/.wh.", "file", b"")], "whiteout without a name"),
])
def test_rules(members, msg):
    with pytest.raises(UnsafeLayer, match=msg):
        _scan(_tar(members), 512)


def test_symlink_replaced_by_file_is_not_a_symlink_any_more():
    _names, _n, rules = _scan(_tar([("s", "symlink", b"/etc"), ("s", "dir", b""), ("s/x", "file", b"1")]), 512)
    assert rules.symlinks == set()


def test_corrupt_streams():
    raw = bytearray(_tar([("a", "file", b"data" * 200)]))
    with pytest.raises(InvalidLayer, match="truncated"):
        _scan(bytes(raw[:700]), 100)
    bad = bytearray(raw)
    bad[10] ^= 0xFF
    with pytest.raises(InvalidLayer, match="checksum"):
        _scan(bytes(bad), 512)
    odd = bytearray(_tar([("s", "file", b"x")], tarfile.USTAR_FORMAT))
    odd[156:157] = b"S"  # old GNU sparse: refused rather than interpreted differently from tar
    odd[148:156] = b"        "
    odd[148:156] = b"%06o\x00 " % sum(odd[:512])
    with pytest.raises(InvalidLayer, match="unsupported tar entry type"):
        _scan(bytes(odd), 512)


def test_global_pax_cannot_rename_everything():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT,
                      pax_headers={"path": "../evil"}) as tf:
        tf.addfile(tarfile.TarInfo("a"), io.BytesIO(b""))
    with pytest.raises(InvalidLayer, match="global pax header"):
        _scan(buf.getvalue(), 512)
