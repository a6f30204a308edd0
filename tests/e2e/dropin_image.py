"""Builds the drop-in tests' busybox image as an OCI image layout and an oci-archive tarball.

Owns only the image bytes (one reproducible gzip layer, config, manifest, index); it starts no program
and never talks to a registry: containerd imports the archive with `ctr images import`, podman with `load`.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MT_INDEX = "application/vnd.oci.image.index.v1+json"

# Fixed times make the layer, and so every digest, the same on every build.
EPOCH = 1700000000
CREATED = "2023-11-14T22:13:20Z"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_BUSYBOX = "/usr/bin/busybox"

PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"


@dataclass(frozen=True)
class BuiltImage:
    """An image written to disk: the OCI layout directory, its archive, and how callers name it."""

    name: str            # full reference, e.g. docker.io/husk-dropin/busybox:latest
    tag: str             # the org.opencontainers.image.ref.name annotation (podman names the image by it)
    layout_dir: Path
    archive: Path        # tar of layout_dir (oci-archive), what `ctr images import` / `podman load` read
    manifest_digest: str
    config_digest: str


def _applet_paths(busybox: str) -> list[str]:
    """Applet paths relative to /, from the binary itself (busybox --list-full), sorted."""
    out = subprocess.run([busybox, "--list-full"], check=True, capture_output=True, text=True).stdout
    paths = sorted({line.strip().lstrip("/") for line in out.splitlines() if line.strip()})
    if not paths:
        raise RuntimeError(f"{busybox} --list-full: printed no applets")
    return [p for p in paths if p != "bin/busybox"]


def _tar_info(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = link
    info.mtime = EPOCH
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def build_layer(busybox: str = DEFAULT_BUSYBOX) -> bytes:
    """The uncompressed layer: /bin/busybox, one symlink per applet, a minimal /etc and the usual dirs."""
    with open(busybox, "rb") as f:
        binary = f.read()
    applets = _applet_paths(busybox)
    dirs = {"bin", "dev", "etc", "proc", "root", "sys", "tmp", "var", "usr", "usr/bin", "usr/sbin", "sbin", "home"}
    for path in applets:
        parent = os.path.dirname(path)
        while parent:
            dirs.add(parent)
            parent = os.path.dirname(parent)
    files = {"etc/passwd": PASSWD.encode(), "etc/group": GROUP.encode(), "etc/hostname": b"dropin\n"}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(dirs):
            tar.addfile(_tar_info(d, tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755))
        tar.addfile(_tar_info("bin/busybox", tarfile.REGTYPE, 0o755, len(binary)), io.BytesIO(binary))
        for path, data in sorted(files.items()):
            tar.addfile(_tar_info(path, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
        for path in applets:
            # Relative targets keep the links valid wherever the rootfs is mounted on the host.
            depth = path.count("/")
            target = "../" * depth + "bin/busybox"
            tar.addfile(_tar_info(path, tarfile.SYMTYPE, 0o777, link=target))
    return buf.getvalue()


def _write_blob(layout: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    path = layout / "blobs" / "sha256" / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return "sha256:" + digest


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build_image(out_dir: Path, name: str = "docker.io/husk-dropin/busybox:latest",
                busybox: str = DEFAULT_BUSYBOX, cmd: tuple[str, ...] = ("sh",)) -> BuiltImage:
    """Write an OCI layout to out_dir/layout and its archive to out_dir/busybox.oci.tar.

    cmd is the image's default command (a long sleep turns the same layer into a pause image).
    """
    if ":" not in name.rsplit("/", 1)[-1]:
        raise ValueError(f"image name {name!r}: needs an explicit :tag")
    tag = name.rsplit(":", 1)[1]
    layout = out_dir / "layout"
    layout.mkdir(parents=True, exist_ok=False)
    raw = build_layer(busybox)
    gz = gzip.compress(raw, compresslevel=6, mtime=0)
    layer_digest = _write_blob(layout, gz)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": CREATED,
        "config": {"Env": [f"PATH={DEFAULT_PATH}"], "Cmd": list(cmd), "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]},
        "history": [{"created": CREATED, "created_by": "husk drop-in tests: busybox-static + applet links"}],
    }
    config_bytes = _canonical(config)
    config_digest = _write_blob(layout, config_bytes)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "config": {"mediaType": MT_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": MT_LAYER, "digest": layer_digest, "size": len(gz)}],
    }
    manifest_bytes = _canonical(manifest)
    manifest_digest = _write_blob(layout, manifest_bytes)
    index = {
        "schemaVersion": 2,
        "mediaType": MT_INDEX,
        "manifests": [{
            "mediaType": MT_MANIFEST,
            "digest": manifest_digest,
            "size": len(manifest_bytes),
            "platform": {"architecture": "amd64", "os": "linux"},
            # containerd names an imported image by the first, podman by the second.
            "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag},
        }],
    }
    (layout / "index.json").write_bytes(_canonical(index))
    (layout / "oci-layout").write_bytes(_canonical({"imageLayoutVersion": "1.0.0"}))
    archive = out_dir / "busybox.oci.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(layout.rglob("*")):
            rel = path.relative_to(layout).as_posix()
            info = tar.gettarinfo(str(path), arcname=rel)
            info.mtime = EPOCH
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isfile():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return BuiltImage(name=name, tag=tag, layout_dir=layout, archive=archive,
                      manifest_digest=manifest_digest, config_digest=config_digest)
