"""The test images husk's tests and critest runs use, built locally from the distro's static binaries as OCI
layouts (reproducible digests), plus the list of registry paths each is pushed as.

`python -m cri_server.images.testimages OUT [--only NAME ...] [--no-big]` (wrapped by scripts/build-test-images).
Registry paths carry no host: hosts.toml files map every upstream registry to the local one's root.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass

from .builder import Entry, ImageSpec, Layer, LayerCache, write_image

BUILDER_VERSION = "1"
MIB = 1024 * 1024

PASSWD = """root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
"""
GROUP = """root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
wheel:x:10:root
mail:x:8:
www-data:x:33:
operator:x:37:
staff:x:50:
users:x:100:
nogroup:x:65534:
"""
# busybox-static lacks pgrep and ipcs; critest uses both (`pgrep sleep`, `ipcs -m`).
PGREP_SH = """#!/bin/sh
# stand-in for `pgrep PATTERN` (busybox-static has no pgrep)
[ $# -eq 1 ] || { echo "usage: pgrep PATTERN" >&2; exit 2; }
rc=1
for d in /proc/[0-9]*; do
    [ "${d#/proc/}" = "$$" ] && continue
    read -r comm 2>/dev/null <"$d/comm" || continue
    if echo "$comm" | grep -q -- "$1"; then echo "${d#/proc/}"; rc=0; fi
done
exit $rc
"""
IPCS_SH = """#!/bin/sh
# stand-in for `ipcs -m` (busybox-static has no ipcs): the IPC namespace's shared memory segments
echo
echo "------ Shared Memory Segments --------"
echo "key        shmid      owner      perms      bytes      nattch     status"
awk 'NR > 1 { printf "0x%08x %-10s %-10s %-10s %-10s %-10s\\n", $1, $2, $4, $3, $5, $7 }' /proc/sysvipc/shm
echo
"""


@dataclass
class Catalog:
    images: list[ImageSpec]


def busybox_entries(busybox: str) -> list[Entry]:
    """A busybox root: the static binary, every applet as a hard link to it, /etc files, pgrep/ipcs stand-ins."""
    out = subprocess.run([busybox, "--list-full"], check=True, capture_output=True, text=True).stdout
    applets = sorted({ln.strip() for ln in out.splitlines() if ln.strip()} - {"bin/busybox"})
    dirs = {"bin": 0o755, "sbin": 0o755, "usr": 0o755, "usr/bin": 0o755, "usr/sbin": 0o755, "usr/local": 0o755,
            "usr/local/bin": 0o755, "etc": 0o755, "root": 0o700, "home": 0o755, "tmp": 0o1777, "var": 0o755,
            "var/run": 0o755, "var/www": 0o755, "var/spool": 0o755, "var/spool/mail": 0o755, "dev": 0o755,
            "proc": 0o555, "sys": 0o555}
    entries = [Entry(p, "dir", m) for p, m in dirs.items()]
    entries.append(Entry("bin/busybox", "file", 0o755, src=busybox))
    have = set()
    for a in applets:
        parent = os.path.dirname(a)
        if parent and parent not in dirs:
            dirs[parent] = 0o755
            entries.append(Entry(parent, "dir", 0o755))
        # Hard links, as in the upstream image: masking /bin/ls must not mask /bin/busybox itself.
        entries.append(Entry(a, "hardlink", 0o755, target="bin/busybox"))
        have.add(os.path.basename(a))
    entries += [Entry("etc/passwd", "file", 0o644, data=PASSWD.encode()),
                Entry("etc/group", "file", 0o644, data=GROUP.encode()),
                Entry("etc/shadow", "file", 0o640, data=b"root:*:10933:0:99999:7:::\n")]
    if "pgrep" not in have:
        entries.append(Entry("usr/bin/pgrep", "file", 0o755, data=PGREP_SH.encode()))
    if "ipcs" not in have:
        entries.append(Entry("usr/bin/ipcs", "file", 0o755, data=IPCS_SH.encode()))
    return entries


def layered_layers(base: Layer) -> list[Layer]:
    """Four layers exercising what layer application must get right (gzip, zstd and uncompressed)."""
    l2 = Layer([
        Entry("data", "dir", 0o755), Entry("data/keep", "dir", 0o750, uid=1000, gid=1000),
        Entry("data/keep/a.txt", "file", 0o644, uid=1000, gid=1000, data=b"version 1\n"),
        Entry("data/keep/exec.sh", "file", 0o755, data=b"#!/bin/sh\necho hi\n"),
        Entry("data/gone", "dir"), Entry("data/gone/file1", "file", 0o644, data=b"1"),
        Entry("data/gone/sub", "dir"), Entry("data/gone/sub/file2", "file", 0o644, data=b"2"),
        Entry("data/file-gone.txt", "file", 0o644, data=b"to be deleted\n"),
        Entry("data/opq", "dir"), Entry("data/opq/old1", "file", 0o644, data=b"old1"),
        Entry("data/opq/old2", "file", 0o644, data=b"old2"),
        Entry("data/hard1", "file", 0o640, uid=33, gid=33, data=b"shared inode\n"),
        Entry("data/hard2", "hardlink", target="data/hard1"),
        Entry("data/link-rel", "symlink", target="keep/a.txt"),
        Entry("data/link-abs", "symlink", target="/etc/passwd"),
        Entry("data/link-dir", "symlink", target="keep"),
        Entry("data/dev", "dir"), Entry("data/dev/null", "chardev", 0o666, major=1, minor=3),
        Entry("data/dev/loop", "blockdev", 0o660, major=7, minor=0), Entry("data/fifo", "fifo", 0o600),
        Entry("data/suid", "file", 0o4755, data=b"#!/bin/sh\nid\n"),
        Entry("data/sticky", "dir", 0o1777),
        Entry("data/xattr-file", "file", 0o644, data=b"x", xattrs={"user.husk": b"test-value"}),
        Entry("home/app", "dir", 0o755, uid=1000, gid=1000),
        Entry("home/app/.profile", "file", 0o644, uid=1000, gid=1000, data=b"export A=1\n"),
    ])
    l3 = Layer([
        Entry("data", "dir", 0o755), Entry("data/gone", "whiteout"), Entry("data/file-gone.txt", "whiteout"),
        Entry("data/opq", "opaque"), Entry("data/opq", "dir", 0o755),
        Entry("data/opq/new1", "file", 0o644, data=b"new1"),
        Entry("data/keep", "dir", 0o750, uid=1000, gid=1000),
        Entry("data/keep/a.txt", "file", 0o600, uid=1000, gid=1000, data=b"version 2\n"),
        Entry("data/link-rel", "file", 0o644, data=b"no longer a link\n"),
        Entry("data/new.txt", "file", 0o644, data=b"added in layer 3\n"),
        Entry("data/new-hard", "file", 0o644, data=b"h"),
        Entry("data/new-hard-2", "hardlink", target="data/new-hard"),
    ], compression="zstd")
    l4 = Layer([
        Entry("etc", "dir", 0o755), Entry("etc/motd", "file", 0o644, data=b"husk layered test image\n"),
        Entry("bin", "dir", 0o755), Entry("bin/vi", "whiteout"),
    ], compression="none")
    return [base, l2, l3, l4]


def random_layer(seed: int, small: int, small_size: int, large: int, large_size: int, prefix: str) -> Layer:
    rng = random.Random(seed)
    entries = [Entry(prefix, "dir"), Entry(f"{prefix}/small", "dir"), Entry(f"{prefix}/large", "dir")]
    for i in range(small):
        d = f"{prefix}/small/d{i // 256:03d}"
        if i % 256 == 0:
            entries.append(Entry(d, "dir"))
        entries.append(Entry(f"{d}/f{i:05d}", "file", 0o644, data=rng.randbytes(small_size)))
    for i in range(large):
        entries.append(Entry(f"{prefix}/large/blob{i}", "file", 0o644, data=rng.randbytes(large_size)))
    return Layer(entries)


def catalog(busybox: str = "/bin/busybox", catatonit: str = "/usr/bin/catatonit", big: bool = True) -> Catalog:
    base = Layer(busybox_entries(busybox))
    sh = {"Cmd": ["sh"]}
    imgs: list[ImageSpec] = []
    bb_refs = ["e2e-test-images/busybox:1.29-2", "library/busybox:latest", "library/busybox:1.37.0"]
    bb_refs += [f"docker/library/busybox:{t}" for t in ("1", "1-glibc", "1-musl", "1-uclibc", "1.35.0-glibc")]
    imgs.append(ImageSpec("busybox", bb_refs, [base], dict(sh)))
    # busybox whose config names a StopSignal (StopContainer must send it when the request names none).
    imgs.append(ImageSpec("busybox-stopsignal", ["husk-test/stopsignal:v1"], [base],
                          {"Cmd": ["sh"], "StopSignal": "SIGUSR1"}))

    pause_layer = Layer([Entry("pause", "file", 0o755, src=catatonit)])
    pause_cfg = {"Entrypoint": ["/pause", "-P"], "User": "65535:65535"}
    imgs.append(ImageSpec("pause", ["pause:3.9"], [pause_layer], dict(pause_cfg)))
    # The sandbox image: same layer, its own config (a label), so removing pause:3.9 by id never removes it.
    imgs.append(ImageSpec("pause-sandbox", ["pause:3.9-husk"], [pause_layer], dict(pause_cfg),
                          {"io.husk.role": "sandbox"}))

    imgs.append(ImageSpec("layered", ["husk-test/layered:v1"], layered_layers(base), {
        "User": "1000:1000", "WorkingDir": "/home/app", "Env": ["PATH=/usr/bin:/bin", "HUSK_TEST=1"],
        "Entrypoint": ["/bin/sh"], "Cmd": ["-c", "id"], "ExposedPorts": {"8080/tcp": {}},
        "Volumes": {"/data/vol": {}}, "StopSignal": "SIGTERM"}, {"io.husk.test": "layered"}))

    reg = "k8s-staging-cri-tools/"
    for name, user in (("test-image-user-uid", "1002"), ("test-image-user-username", "www-data"),
                       ("test-image-user-uid-group", "1003:1004"),
                       ("test-image-user-username-group", "www-data:1004")):
        imgs.append(ImageSpec(name, [reg + name + ":latest"], [base], {"Cmd": ["sh"], "User": user}))
    for name in ("test-image-1", "test-image-2", "test-image-3", "test-image-latest", "test-image-digest"):
        imgs.append(ImageSpec(name, [reg + name + ":latest"], [base, Layer([Entry(name, "file", 0o644)])],
                              dict(sh)))
    imgs.append(ImageSpec("test-image-tags", [reg + "test-image-tags:" + t for t in ("1", "2", "3")],
                          [base, Layer([Entry("same-image", "file", 0o644)])], dict(sh)))
    for tag in ("test", "all"):
        imgs.append(ImageSpec("test-image-tag-" + tag, [reg + "test-image-tag:" + tag],
                              [base, Layer([Entry(tag, "file", 0o644)])], dict(sh)))

    if big:
        # ~100 MB compressed (random data does not compress): many small files, a few large ones, a mix.
        layers = [base, random_layer(1, 4000, 4096, 0, 0, "data1"), random_layer(2, 0, 0, 4, 12 * MIB, "data2"),
                  random_layer(3, 1500, 16384, 2, 4 * MIB, "data3")]
        imgs.append(ImageSpec("big", ["husk-test/big:v1"], layers, dict(sh)))
    return Catalog(imgs)


def _recipe(spec: ImageSpec, inputs: list[str]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([BUILDER_VERSION, spec.name, spec.refs, spec.config, spec.labels], sort_keys=True).encode())
    for p in inputs:
        st = os.stat(p)
        h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def build(out: str, only: list[str] | None = None, big: bool = True, busybox: str = "/bin/busybox",
          catatonit: str = "/usr/bin/catatonit", force: bool = False, log=print) -> dict[str, dict]:  # type: ignore[no-untyped-def,type-arg]
    """Build (or reuse) layouts under `out`; write `out/images.json` and `out/push-list.txt`; return the index."""
    os.makedirs(out, exist_ok=True)
    index_path = os.path.join(out, "images.json")
    try:
        with open(index_path) as f:
            index: dict[str, dict] = json.load(f)  # type: ignore[type-arg]
    except (OSError, ValueError):
        index = {}
    cat = catalog(busybox, catatonit, big and (not only or "big" in only))
    cache = LayerCache()
    for spec in cat.images:
        if only and spec.name not in only:
            continue
        recipe = _recipe(spec, [busybox, catatonit])
        old = index.get(spec.name)
        if not force and old and old.get("recipe") == recipe and os.path.isfile(
                os.path.join(out, spec.name, "index.json")):
            continue
        built = write_image(out, spec, cache)
        index[spec.name] = {"layout": spec.name, "refs": list(spec.refs), "manifest": built.manifest_digest,
                            "id": built.config_digest, "size": built.size, "recipe": recipe}
        log(f"built {spec.name:32s} {built.config_digest[:19]}  {built.size / 1e6:7.1f} MB -> {', '.join(spec.refs)}")
    tmp = index_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(index, f, indent=1, sort_keys=True)
    os.replace(tmp, index_path)
    with open(os.path.join(out, "push-list.txt"), "w") as f:
        f.writelines(" ".join([os.path.join(out, index[name]["layout"])] + index[name]["refs"]) + "\n" for name in sorted(index))
    return index


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="build-test-images", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", help="output directory (default: .cache/test-images in the repository)")
    ap.add_argument("--only", action="append", help="build only this image (repeatable)")
    ap.add_argument("--no-big", action="store_true", help="skip the ~100 MB benchmark image")
    ap.add_argument("--busybox", default="/bin/busybox")
    ap.add_argument("--catatonit", default="/usr/bin/catatonit")
    ap.add_argument("--force", action="store_true", help="rebuild even when the layout is up to date")
    ap.add_argument("--list", action="store_true", help="print the catalog and exit")
    a = ap.parse_args(argv)
    if a.list:
        for s in catalog(a.busybox, a.catatonit, big=False).images:
            print(f"{s.name:32s} {' '.join(s.refs)}")
        print(f"{'big':32s} husk-test/big:v1")
        return 0
    out = a.out or os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                ".cache", "test-images")
    build(out, a.only, not a.no_big, a.busybox, a.catatonit, a.force)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
