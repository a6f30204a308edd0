"""Writing OCI image layouts from lists of file entries, reproducibly (fixed mtimes, sorted members, gzip mtime 0).

Used to build the pause image on air-gapped nodes and the test images (testimages.py). It only writes files
under the output directory; it never runs a container or talks to a registry.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
from dataclasses import dataclass, field
from typing import Any

from . import manifest as mt

EPOCH = 1700000000  # fixed mtime for every tar entry
CREATED = "2023-11-14T22:13:20Z"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"


@dataclass
class Entry:
    """One layer member. kind: dir, file, symlink, hardlink, chardev, blockdev, fifo, whiteout, opaque."""

    path: str  # relative, no leading slash
    kind: str
    mode: int = 0o755
    uid: int = 0
    gid: int = 0
    data: bytes = b""
    src: str | None = None  # a host file whose content is copied
    target: str = ""  # symlink target, or hard link target path
    major: int = 0
    minor: int = 0
    xattrs: dict[str, bytes] = field(default_factory=dict)
    mtime: int = EPOCH


def _tarinfo(e: Entry) -> tuple[tarfile.TarInfo, bytes | None]:
    name = e.path
    data: bytes | None = None
    ti = tarfile.TarInfo(name)
    if e.kind == "whiteout":
        d, _, b = e.path.rpartition("/")
        ti = tarfile.TarInfo(f"{d}/.wh.{b}" if d else f".wh.{b}")
        ti.type, ti.mode, data = tarfile.REGTYPE, 0o644, b""
    elif e.kind == "opaque":
        ti = tarfile.TarInfo(f"{e.path}/.wh..wh..opq" if e.path else ".wh..wh..opq")
        ti.type, ti.mode, data = tarfile.REGTYPE, 0o644, b""
    else:
        ti.mode = e.mode
        if e.kind == "dir":
            ti.type = tarfile.DIRTYPE
        elif e.kind == "symlink":
            ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, e.target, 0o777
        elif e.kind == "hardlink":
            ti.type, ti.linkname = tarfile.LNKTYPE, e.target
        elif e.kind in ("chardev", "blockdev"):
            ti.type = tarfile.CHRTYPE if e.kind == "chardev" else tarfile.BLKTYPE
            ti.devmajor, ti.devminor = e.major, e.minor
        elif e.kind == "fifo":
            ti.type = tarfile.FIFOTYPE
        elif e.kind == "file":
            data = e.data
            if e.src is not None:
                with open(e.src, "rb") as f:
                    data = f.read()
        else:
            raise ValueError(f"unknown entry kind {e.kind!r} for {e.path!r}")
    ti.mtime = e.mtime
    ti.uid, ti.gid = e.uid, e.gid
    ti.uname = ti.gname = ""
    if e.xattrs:
        ti.pax_headers = {f"SCHILY.xattr.{k}": v.decode("utf-8", "surrogateescape") for k, v in e.xattrs.items()}
    if data is not None:
        ti.size = len(data)
    return ti, data


def layer_tar(entries: list[Entry], sort: bool = True) -> bytes:
    """The uncompressed tar of `entries` (sorted by path with hard links last, unless sort=False)."""
    raw = io.BytesIO()
    order = sorted(entries, key=lambda e: (e.kind == "hardlink", e.path)) if sort else entries
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in order:
            ti, data = _tarinfo(e)
            tar.addfile(ti, io.BytesIO(data) if data is not None else None)
    return raw.getvalue()


def compress(raw: bytes, compression: str) -> tuple[bytes, str]:
    """(blob, OCI layer media type) for an uncompressed tar."""
    if compression == "gzip":
        gz = io.BytesIO()
        with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, compresslevel=6) as g:
            g.write(raw)
        return gz.getvalue(), mt.OCI_LAYER_GZIP
    if compression == "zstd":
        from .unpack import _zstd_module
        return _zstd_module().compress(raw, level=3), mt.OCI_LAYER_ZSTD
    if compression == "none":
        return raw, mt.OCI_LAYER
    raise ValueError(f"unknown compression {compression!r}")


@dataclass
class Layer:
    entries: list[Entry]
    compression: str = "gzip"
    raw: bytes | None = None  # a pre-built tar stream (hostile test layers), used instead of entries


@dataclass
class ImageSpec:
    name: str  # layout directory name
    refs: list[str]  # references this image is published as (registry path[:tag]); informational here
    layers: list[Layer]
    config: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    architecture: str = "amd64"
    os: str = "linux"
    docker_types: bool = False  # Docker schema2 media types instead of OCI


class LayerCache:
    """Layers shared by several images are built and compressed once (keyed by object identity)."""

    def __init__(self) -> None:
        self._by_id: dict[tuple[int, str], tuple[bytes, str, str]] = {}
        self._keep: list[Layer] = []

    def get(self, layer: Layer) -> tuple[bytes, str, str]:
        """(blob, media type, diff_id)."""
        key = (id(layer), layer.compression)
        if key not in self._by_id:
            raw = layer.raw if layer.raw is not None else layer_tar(layer.entries)
            blob, media_type = compress(raw, layer.compression)
            self._by_id[key] = (blob, media_type, mt.sha256_digest(raw))
            self._keep.append(layer)  # keep the object alive so its id is not reused
        return self._by_id[key]


def write_blob(layout: str, data: bytes) -> str:
    d = mt.sha256_digest(data)
    p = os.path.join(layout, "blobs", "sha256", d.split(":", 1)[1])
    if not os.path.exists(p):
        with open(p + ".tmp", "wb") as f:
            f.write(data)
        os.rename(p + ".tmp", p)
    return d


@dataclass(frozen=True)
class Built:
    name: str
    layout: str
    manifest_digest: str
    config_digest: str
    refs: tuple[str, ...]
    size: int  # manifest + config + layer blobs


def image_blobs(spec: ImageSpec, cache: LayerCache) -> tuple[bytes, bytes, list[tuple[bytes, str]]]:
    """(manifest bytes, config bytes, [(layer blob, media type)])."""
    layer_descs, diff_ids, history, blobs = [], [], [], []
    for layer in spec.layers:
        blob, media_type, diff_id = cache.get(layer)
        if spec.docker_types:
            media_type = mt.DOCKER_LAYER_GZIP if media_type == mt.OCI_LAYER_GZIP else media_type
        layer_descs.append({"mediaType": media_type, "digest": mt.sha256_digest(blob), "size": len(blob)})
        diff_ids.append(diff_id)
        history.append({"created": CREATED, "created_by": "husk builder"})
        blobs.append((blob, media_type))
    cfg: dict[str, Any] = {"Env": ["PATH=" + DEFAULT_PATH]}
    cfg.update(spec.config)
    if spec.labels:
        cfg["Labels"] = dict(spec.labels)
    config = {"created": CREATED, "architecture": spec.architecture, "os": spec.os, "config": cfg,
              "rootfs": {"type": "layers", "diff_ids": diff_ids}, "history": history}
    cfg_b = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": mt.DOCKER_MANIFEST if spec.docker_types else mt.OCI_MANIFEST,
        "config": {"mediaType": mt.DOCKER_CONFIG if spec.docker_types else mt.OCI_CONFIG,
                   "digest": mt.sha256_digest(cfg_b), "size": len(cfg_b)},
        "layers": layer_descs,
    }
    man_b = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return man_b, cfg_b, blobs


def write_image(out: str, spec: ImageSpec, cache: LayerCache, tag: str = "latest") -> Built:
    """Write `spec` as an OCI layout in `out/<spec.name>` (replacing it), the manifest tagged `tag`."""
    layout = os.path.join(out, spec.name)
    if os.path.exists(layout):
        shutil.rmtree(layout)
    os.makedirs(os.path.join(layout, "blobs", "sha256"))
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    man_b, cfg_b, blobs = image_blobs(spec, cache)
    size = len(man_b) + len(cfg_b)
    for blob, _media_type in blobs:
        write_blob(layout, blob)
        size += len(blob)
    cfg_d = write_blob(layout, cfg_b)
    man_d = write_blob(layout, man_b)
    index = {
        "schemaVersion": 2,
        "mediaType": mt.OCI_INDEX,
        "manifests": [{
            "mediaType": mt.DOCKER_MANIFEST if spec.docker_types else mt.OCI_MANIFEST,
            "digest": man_d, "size": len(man_b),
            "annotations": {REF_NAME: tag},
            "platform": {"architecture": spec.architecture, "os": spec.os},
        }],
    }
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump(index, f, sort_keys=True)
    return Built(spec.name, layout, man_d, cfg_d, tuple(spec.refs), size)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
    return "sha256:" + h.hexdigest()


def pause_image(catatonit: str = "/usr/bin/catatonit", name: str = "pause") -> ImageSpec:
    """The sandbox (pause) image: a static catatonit as /pause, run as `/pause -P`, user 65535."""
    layer = Layer([Entry("pause", "file", 0o755, src=catatonit)])
    return ImageSpec(name, ["registry.k8s.io/pause:3.9"], [layer],
                     {"Entrypoint": ["/pause", "-P"], "User": "65535:65535"})


def write_index_image(out: str, name: str, specs: list[ImageSpec], cache: LayerCache,
                      tag: str = "latest", variants: dict[str, str] | None = None) -> Built:
    """Write a multi-platform image: an OCI layout whose index.json points to an image index listing one
    manifest per spec (platform from spec.os/spec.architecture, plus `variants[spec.name]`)."""
    layout = os.path.join(out, name)
    if os.path.exists(layout):
        shutil.rmtree(layout)
    os.makedirs(os.path.join(layout, "blobs", "sha256"))
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    entries = []
    size = 0
    for spec in specs:
        man_b, cfg_b, blobs = image_blobs(spec, cache)
        for blob, _t in blobs:
            write_blob(layout, blob)
            size += len(blob)
        write_blob(layout, cfg_b)
        man_d = write_blob(layout, man_b)
        size += len(man_b) + len(cfg_b)
        plat: dict[str, str] = {"architecture": spec.architecture, "os": spec.os}
        if variants and variants.get(spec.name):
            plat["variant"] = variants[spec.name]
        entries.append({"mediaType": mt.DOCKER_MANIFEST if spec.docker_types else mt.OCI_MANIFEST,
                        "digest": man_d, "size": len(man_b), "platform": plat})
    idx_b = json.dumps({"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": entries},
                       sort_keys=True, separators=(",", ":")).encode()
    idx_d = write_blob(layout, idx_b)
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": [
            {"mediaType": mt.OCI_INDEX, "digest": idx_d, "size": len(idx_b), "annotations": {REF_NAME: tag}}]},
            f, sort_keys=True)
    return Built(name, layout, idx_d, "", tuple(specs[0].refs) if specs else (), size)
