"""runtime.mountinfo: the octal escapes, the parsed fields, and the mount that holds a path (overmounts, hidden
mounts, path boundaries)."""
from __future__ import annotations

import pytest

from runtime import mountinfo
from runtime.mountinfo import unescape


@pytest.mark.parametrize("field,path", [
    ("/plain", "/plain"),
    ("/a\\040b", "/a b"),
    ("/end\\040", "/end "),                      # an escape that ends the field
    ("/t\\011n\\012b\\134", "/t\tn\nb\\"),
    ("/short\\04", "/short\\04"),                # not three digits: kept as it is
    ("/caf\\303\\251", "/café"),                 # escaped bytes of a UTF-8 name
    ("/ü\\040x", "/ü x"),
])
def test_unescape(field, path):
    assert unescape(field) == path


# --- the parser and "the mount that holds this path" (runtime.mountinfo) ---------------------------------------
# 1 is the root; 2 on /a; 3 on /a/b; 4 mounted over /a (hides 3); 5 on /a/b inside 4; 6 on /x y (escaped);
# 7 on /c/d, then 8 on /c (hides 7: a later, shorter mount of the same parent)
TABLE = """\
1 0 8:1 / / rw,relatime shared:1 - ext4 /dev/root rw
2 1 0:40 / /a rw - tmpfs t1 rw
3 2 0:41 / /a/b rw - tmpfs t2 rw
4 2 0:42 / /a rw master:3 - tmpfs t3 rw
5 4 0:43 / /a/b rw - proc proc rw
6 1 0:44 /sub /x\\040y rw shared:7 - overlay over\\040lay rw,lowerdir=/l\\0541:/l2,upperdir=/u\\040p
7 1 0:45 / /c/d rw - tmpfs t4 rw
8 1 0:46 / /c rw - tmpfs t5 rw
"""


def test_parse_unescapes_every_path_field() -> None:
    m = {x.id: x for x in mountinfo.parse(TABLE)}[6]
    assert (m.point, m.root, m.source, m.fstype) == ("/x y", "/sub", "over lay", "overlay")
    assert m.optional == ["shared:7"] and m.shared and not m.slave
    # superblock options split on the kernel's commas, then unescaped: an escaped comma stays in its value
    assert m.super_options == ["rw", "lowerdir=/l,1:/l2", "upperdir=/u p"]


def test_parse_skips_malformed_lines() -> None:
    assert [m.id for m in mountinfo.parse("garbage\n\n1 0 8:1 / / rw - ext4 /dev/root rw\n")] == [1]


@pytest.mark.parametrize("path,mount_id", [
    ("/", 1), ("/etc/passwd", 1),
    ("/a", 4), ("/a/file", 4),            # the overmount, not the mount under it
    ("/a/b/c", 5),                        # nested in the overmount; 3 (under 4) is hidden
    ("/ab", 1),                           # a path boundary, not a string prefix
    ("/x y/z", 6),                        # an escaped mount point compared unescaped
    ("/c/d/e", 8),                        # 7 is hidden under 8, mounted later on a shorter path
])
def test_mount_of(path: str, mount_id: int) -> None:
    m = mountinfo.mount_of(path, mountinfo.parse(TABLE))
    assert m is not None and m.id == mount_id


def test_mount_at_only_an_exact_mount_point() -> None:
    table = mountinfo.parse(TABLE)
    assert mountinfo.mount_at("/a/b/c", table) is None
    assert mountinfo.mount_at("/a/b", table).id == 5  # type: ignore[union-attr]


def test_mount_of_without_a_tree_takes_the_longest_mount_point() -> None:
    # a table whose root is not listed (a chroot's view): the longest, latest mount point holding the path
    table = mountinfo.parse("30 22 0:40 / /m rw - tmpfs a rw\n31 22 0:41 / /m/n rw - tmpfs b rw\n")
    assert mountinfo.mount_of("/m/n/o", table).id == 31  # type: ignore[union-attr]
    assert mountinfo.mount_of("/q", table) is None


def test_mounts_under_includes_hidden_ones() -> None:
    assert [m.id for m in mountinfo.mounts_under("/a", mountinfo.parse(TABLE))] == [2, 3, 4, 5]
    assert len(mountinfo.mounts_under("/", mountinfo.parse(TABLE))) == 8


def test_the_live_table() -> None:
    # other tests may mount and unmount meanwhile: only /proc, which stays, is compared across reads
    proc = mountinfo.mount_of("/proc/self", mountinfo.read())
    assert proc is not None and proc.fstype == "proc"
    assert mountinfo.mount_of("/proc/self").id == proc.id  # type: ignore[union-attr]
    assert proc.id in mountinfo.mount_ids()


def test_cri_propagation_check_sees_escaped_mount_points() -> None:
    # failed before: spec/mounts.py unescaped only \040, so a shared mount at a path with a tab was not found
    # and the volume was refused as "not shared"
    from cri_server.api.v1 import api_pb2 as pb
    from cri_server.spec.mounts import _check_propagation
    text = "22 1 8:1 / / rw - ext4 /dev/root rw\n30 22 0:40 / /mnt/a\\011b rw shared:5 - tmpfs t rw\n"
    _check_propagation(0, "/mnt/a\tb/vol", pb.PROPAGATION_BIDIRECTIONAL, text)


def test_read_only_decodes_the_types_asked_for() -> None:
    cgroups = mountinfo.read(fstypes=("cgroup", "cgroup2"))
    assert all(m.fstype in ("cgroup", "cgroup2") for m in cgroups)
    assert [m.id for m in cgroups] == [m.id for m in mountinfo.read() if m.fstype in ("cgroup", "cgroup2")]
