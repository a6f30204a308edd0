"""Layer application (GNU tar + scanner, and the tarfile applier): overlay-form output and hostile layers."""
from __future__ import annotations

import gzip
import json
import os
import stat
import tarfile

import pytest

from cri_server.images import unpack
from cri_server.images.builder import Entry, compress, layer_tar
from cri_server.images.errors import InvalidLayer, UnsafeLayer
from tests.support.imagetest import member, raw_tar, tree

pytestmark = pytest.mark.root
APPLIERS = ["gnutar", "tarfile"]


def _blob(tmp: str, raw: bytes, compression: str = "gzip") -> str:
    data, _mt = compress(raw, compression)
    p = os.path.join(tmp, f"layer.{compression}")
    with open(p, "wb") as f:
        f.write(data)
    return p


def _layout_layers(layout: str) -> list[tuple[str, str]]:
    with open(os.path.join(layout, "index.json")) as f:
        man_d = json.load(f)["manifests"][0]["digest"]
    with open(os.path.join(layout, "blobs", "sha256", man_d[7:])) as f:
        man = json.load(f)
    return [(os.path.join(layout, "blobs", "sha256", x["digest"][7:]), x["mediaType"]) for x in man["layers"]]


@pytest.mark.parametrize("applier", APPLIERS)
def test_layered_image_layers_in_overlay_form(tmp_path, test_images, applier):
    layers = _layout_layers(test_images["layered"])
    dirs = []
    for i, (path, _mt) in enumerate(layers):
        d = tmp_path / f"l{i}"
        d.mkdir()
        res = unpack.APPLIERS[applier](path, "auto", str(d), f"layer{i}")
        assert res.diff_id.startswith("sha256:")
        dirs.append(str(d))
    l2, l3, l4 = dirs[1], dirs[2], dirs[3]
    # hard links share an inode; ownership, modes, devices, xattrs kept
    a, b = os.lstat(f"{l2}/data/hard1"), os.lstat(f"{l2}/data/hard2")
    assert a.st_ino == b.st_ino and a.st_nlink == 2 and (a.st_uid, a.st_gid) == (33, 33)
    assert stat.S_IMODE(a.st_mode) == 0o640
    assert stat.S_IMODE(os.lstat(f"{l2}/data/suid").st_mode) == 0o4755
    assert stat.S_IMODE(os.lstat(f"{l2}/data/sticky").st_mode) == 0o1777
    st = os.lstat(f"{l2}/data/keep")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1000, 1000, 0o750)
    dev = os.lstat(f"{l2}/data/dev/null")
    assert stat.S_ISCHR(dev.st_mode) and (os.major(dev.st_rdev), os.minor(dev.st_rdev)) == (1, 3)
    blk = os.lstat(f"{l2}/data/dev/loop")
    assert stat.S_ISBLK(blk.st_mode) and os.major(blk.st_rdev) == 7
    assert stat.S_ISFIFO(os.lstat(f"{l2}/data/fifo").st_mode)
    assert os.readlink(f"{l2}/data/link-abs") == "/etc/passwd"
    assert os.getxattr(f"{l2}/data/xattr-file", "user.husk") == b"test-value"
    assert os.lstat(f"{l2}/data/keep/a.txt").st_mtime == 1700000000
    # whiteouts became 0/0 character devices, the opaque marker an xattr; no .wh. file is left
    for w in ("data/gone", "data/file-gone.txt"):
        st = os.lstat(f"{l3}/{w}")
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0, w
    assert os.getxattr(f"{l3}/data/opq", "trusted.overlay.opaque") == b"y"
    assert sorted(os.listdir(f"{l3}/data/opq")) == ["new1"]
    assert stat.S_ISCHR(os.lstat(f"{l4}/bin/vi").st_mode)
    for d in dirs:
        for dirpath, dirnames, filenames in os.walk(d):
            assert not [n for n in dirnames + filenames if n.startswith(".wh.")], dirpath


def test_appliers_agree(tmp_path, test_images):
    for i, (path, _mt) in enumerate(_layout_layers(test_images["layered"])):
        results = []
        for applier in APPLIERS:
            d = tmp_path / f"{applier}{i}"
            d.mkdir()
            res = unpack.APPLIERS[applier](path, "auto", str(d), f"layer{i}")
            t = tree(str(d), with_dir_mtime=True)
            # Parents missing from the archive (home/ for home/app) get the extraction time: not comparable.
            t = {k: v if v[0] != stat.S_IFDIR or v[-1] == 1700000000 * 10**9 else v[:-1] + (None,)
                 for k, v in t.items()}
            results.append((res.diff_id, t))
        assert results[0][0] == results[1][0]
        assert results[0][1] == results[1][1]


@pytest.mark.parametrize("applier", APPLIERS)
@pytest.mark.parametrize("compression", ["gzip", "zstd", "none"])
def test_compressions(tmp_path, applier, compression):
    raw = layer_tar([Entry("f", "file", 0o644, data=b"hello"), Entry(".wh.gone", "file", 0o644)])
    p = _blob(str(tmp_path), raw, compression)
    d = tmp_path / "out"
    d.mkdir()
    res = unpack.APPLIERS[applier](p, "auto", str(d), "l")
    assert (d / "f").read_bytes() == b"hello"
    assert res.uncompressed_size == len(raw)


def _outside_state(root: str) -> dict[str, tuple]:  # type: ignore[type-arg]
    return tree(root, with_dir_mtime=True)


HOSTILE = {
    "dotdot": ([member("../../outside/pwned")], UnsafeLayer),
    "dotdot-inner": ([member("a/../../outside/pwned")], UnsafeLayer),
    "absolute": ([member("/OUTSIDE/pwned")], UnsafeLayer),
    "symlink-abs-then-write": ([member("evil", "symlink", link="/OUTSIDE"), member("evil/pwned")], UnsafeLayer),
    "symlink-rel-then-write": ([member("evil", "symlink", link="../outside"), member("evil/pwned")], UnsafeLayer),
    "symlink-chain": ([member("a", "symlink", link="."), member("b", "symlink", link="a/../../outside"),
                       member("b/pwned")], UnsafeLayer),
    "symlink-then-dir": ([member("evil", "symlink", link="/OUTSIDE"), member("evil/sub", "dir")], UnsafeLayer),
    "symlink-then-whiteout": ([member("evil", "symlink", link="/OUTSIDE"), member("evil/.wh.secret", data=b"")],
                              UnsafeLayer),
    "hardlink-dotdot": ([member("hl", "hardlink", link="../outside/secret")], UnsafeLayer),
    "hardlink-absolute": ([member("hl", "hardlink", link="/OUTSIDE/secret")], UnsafeLayer),
    "hardlink-through-symlink": ([member("evil", "symlink", link="/OUTSIDE"),
                                  member("hl", "hardlink", link="evil/secret")], UnsafeLayer),
    "pax-path-dotdot": ([member("innocent", pax={"path": "../../outside/pwned"})], UnsafeLayer),
    "pax-linkpath-escape": ([member("evil", "symlink", link="x", pax={"linkpath": "/OUTSIDE"}),
                             member("evil/pwned")], UnsafeLayer),
    "overlay-xattr": ([member("f", pax={"SCHILY.xattr.trusted.overlay.redirect": "/x"})], UnsafeLayer),
}


@pytest.mark.parametrize("applier", APPLIERS)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_layers_write_nothing_outside(tmp_path, applier, case):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("do not touch\n")
    before = _outside_state(str(outside))
    members, exc = HOSTILE[case]
    for ti, _data in members:
        ti.name = ti.name.replace("/OUTSIDE", str(outside))
        ti.linkname = ti.linkname.replace("/OUTSIDE", str(outside))
        ti.pax_headers = {k: v.replace("/OUTSIDE", str(outside)) for k, v in ti.pax_headers.items()}
    raw = raw_tar(members)
    p = _blob(str(tmp_path), raw)
    snap = tmp_path / "a" / "b" / "snap"
    snap.mkdir(parents=True)
    with pytest.raises(exc) as ei:
        unpack.APPLIERS[applier](p, "gzip", str(snap), f"hostile-{case}")
    assert "member" in str(ei.value) and "hostile" in str(ei.value)
    assert _outside_state(str(outside)) == before
    # nothing named pwned anywhere but inside the snapshot dir
    for dirpath, _dirs, files in os.walk(tmp_path):
        if not dirpath.startswith(str(snap)):
            assert "pwned" not in files, dirpath


def _corrupt_checksum(raw: bytes) -> bytes:
    b = bytearray(raw)
    b[0] ^= 0x01  # first header's name changes, checksum no longer matches
    return bytes(b)


@pytest.mark.parametrize("applier", APPLIERS)
def test_truncated_gzip_is_an_error(tmp_path, applier):
    raw = layer_tar([Entry("f", "file", 0o644, data=os.urandom(100000))])
    data, _ = compress(raw, "gzip")
    p = tmp_path / "t.gz"
    p.write_bytes(data[: len(data) // 2])
    d = tmp_path / "out"
    d.mkdir()
    with pytest.raises(InvalidLayer):
        unpack.APPLIERS[applier](str(p), "gzip", str(d), "truncated")


@pytest.mark.parametrize("applier", APPLIERS)
def test_bad_header_checksum_is_an_error(tmp_path, applier):
    raw = _corrupt_checksum(layer_tar([Entry("f", "file", 0o644, data=b"x")]))
    p = tmp_path / "c.gz"
    p.write_bytes(gzip.compress(raw))
    d = tmp_path / "out"
    d.mkdir()
    with pytest.raises(InvalidLayer):
        unpack.APPLIERS[applier](str(p), "gzip", str(d), "badsum")


def test_nothing_after_the_end_marker_is_extracted(tmp_path):
    """GNU tar never sees bytes after the end-of-archive marker, so data hidden there is not extracted."""
    good = layer_tar([Entry("ok", "file", 0o644, data=b"ok")])
    hidden = raw_tar([member("../outside-pwned")])
    p = tmp_path / "tail.gz"
    p.write_bytes(gzip.compress(good + hidden))
    d = tmp_path / "snap"
    d.mkdir()
    res = unpack.apply_gnutar(str(p), "gzip", str(d), "tail")
    assert (d / "ok").read_bytes() == b"ok"
    assert not (tmp_path / "outside-pwned").exists()
    assert res.uncompressed_size == len(good) + len(hidden)


def test_header_only_member_with_data_is_refused(tmp_path):
    ti = tarfile.TarInfo("link")
    ti.type = tarfile.SYMTYPE
    ti.linkname = "x"
    hdr = bytearray(ti.tobuf(tarfile.USTAR_FORMAT))
    hdr[124:136] = b"%011o\x00" % 512  # claims 512 bytes of data behind a symlink header
    hdr[148:156] = b"        "
    hdr[148:156] = b"%06o\x00 " % sum(hdr)
    p = tmp_path / "h.gz"
    p.write_bytes(gzip.compress(bytes(hdr) + raw_tar([member("../../pwned")])))
    d = tmp_path / "snap"
    d.mkdir()
    with pytest.raises(InvalidLayer, match="carries 512 bytes"):
        unpack.apply_gnutar(str(p), "gzip", str(d), "sizedlink")


@pytest.mark.parametrize("applier", APPLIERS)
def test_file_over_nonempty_directory_is_a_layer_error(tmp_path, applier):
    raw = raw_tar([member("d", "dir"), member("d/x"), member("d")])
    p = _blob(str(tmp_path), raw)
    d = tmp_path / "snap"
    d.mkdir()
    with pytest.raises(InvalidLayer, match="layer odd"):
        unpack.APPLIERS[applier](p, "gzip", str(d), "odd")
