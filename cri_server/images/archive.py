"""Import and export of image archives: OCI image layouts (directory or tar) and docker-archive tars
(`docker save` format). Reading puts verified blobs into the content store and returns rows to record; layer
unpacking and naming policy are the service's. Blocking code: run it in a worker thread.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass

from . import manifest as mf
from .content import ContentStore, hash_file
from .errors import (
    ArchiveError,
    ContentError,
    ImageError,
    InvalidManifest,
    InvalidReference,
    UnsafeLayer,
)
from .metadata import ImageRow
from .pull import layer_records
from .records import ImageRecord
from .reference import Reference, parse, validate_digest
from .unpack import open_decompressed

log = logging.getLogger(__name__)

REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"


@dataclass
class ImportedImage:
    row: ImageRow
    top_digest: str  # what names point at (the manifest, or the index it was chosen from)
    hints: list[str]  # names found in the archive (full references or bare tags)


# -- reading ------------------------------------------------------------------------------------------------

def _safe_extract(path: str, dest: str) -> None:
    """Extract an archive's regular files and directories only, refusing anything that leaves `dest`: leading
    slashes stripped, `..` refused (tarscan.clean_name), files 0644 and directories 0755 whatever the archive
    says, nothing followed (no link is ever made here, and O_NOFOLLOW). By hand rather than tarfile's
    filter="data": that argument is Python 3.11.4's, and Debian 12's interpreter (3.11.2) has no filters."""
    from .tarscan import clean_name
    try:
        with tarfile.open(path, "r:*") as tf:
            for m in tf:
                if not (m.isfile() or m.isdir()):
                    continue
                try:
                    rel = clean_name(m.name.lstrip("/"), path)
                    target = os.path.join(dest, rel) if rel else dest
                    if m.isdir():
                        _makedirs(dest, rel)
                        continue
                    if not rel:
                        raise OSError(f"a file named {m.name!r} would replace the archive's directory")
                    _makedirs(dest, os.path.dirname(rel))
                    src = tf.extractfile(m)
                    assert src is not None   # a regular file's member always has data
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 0o600)
                    with src, os.fdopen(fd, "wb") as out:
                        os.fchmod(fd, 0o644)   # whatever the umask and the archive say
                        shutil.copyfileobj(src, out, 1 << 20)
                except UnsafeLayer as e:
                    raise ArchiveError(path, e.reason) from None   # its text names the member already
                except OSError as e:
                    raise ArchiveError(path, f"member {m.name!r}: {e}") from None
    except tarfile.TarError as e:
        raise ArchiveError(path, f"not a readable tar archive: {e}") from None


def _makedirs(dest: str, rel: str) -> None:
    """`dest/rel` and the directories above it, each 0755 whatever the umask (none is a link: nothing here makes
    one)."""
    path = dest
    for part in rel.split("/") if rel else ():
        path = os.path.join(path, part)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not os.path.isdir(path):
                raise OSError(f"{path!r} is a file, not a directory") from None
            continue
        os.chmod(path, 0o755)


def read_archive(path: str, content: ContentStore, platform: mf.Platform, all_platforms: bool,
                 tmp_root: str) -> list[ImportedImage]:
    if os.path.isdir(path):
        return _read_dir(path, path, content, platform, all_platforms)
    if not os.path.isfile(path):
        raise ArchiveError(path, "no such file or directory")
    os.makedirs(tmp_root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="import-", dir=tmp_root)
    try:
        _safe_extract(path, tmp)
        return _read_dir(path, tmp, content, platform, all_platforms)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _read_dir(label: str, d: str, content: ContentStore, platform: mf.Platform,
              all_platforms: bool) -> list[ImportedImage]:
    if os.path.isfile(os.path.join(d, "index.json")) and os.path.isfile(os.path.join(d, "oci-layout")):
        return _read_oci(label, d, content, platform, all_platforms)
    if os.path.isfile(os.path.join(d, "manifest.json")):
        return _read_docker(label, d, content)
    raise ArchiveError(label, "neither an OCI image layout (oci-layout, index.json) nor a docker-archive"
                              " (manifest.json)")


def _load_json(label: str, path: str) -> object:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError) as e:
        raise ArchiveError(label, f"{os.path.basename(path)}: {e}") from None


def _blob_path(label: str, d: str, digest: str) -> str:
    try:
        validate_digest(digest)
    except InvalidReference as e:
        raise ArchiveError(label, f"bad digest {digest!r}: {e.reason}") from None
    algo, hexpart = digest.split(":", 1)
    p = os.path.join(d, "blobs", algo, hexpart)
    if not os.path.isfile(p):
        raise ArchiveError(label, f"blob {digest} is missing from the layout")
    return p


def _put(label: str, d: str, content: ContentStore, desc: mf.Descriptor) -> None:
    if content.exists(desc.digest):
        return
    try:
        content.put_file(_blob_path(label, d, desc.digest), desc.digest, desc.size, f"{label}: blob {desc.digest}")
    except ContentError as e:
        raise ArchiveError(label, str(e)) from None


def _read_blob(label: str, d: str, desc: mf.Descriptor) -> bytes:
    p = _blob_path(label, d, desc.digest)
    with open(p, "rb") as f:
        data = f.read(max(desc.size, 0) + 1)
    if len(data) != desc.size or mf.sha256_digest(data) != desc.digest:
        raise ArchiveError(label, f"blob {desc.digest} does not match its descriptor")
    return data


def _image_from_manifest(label: str, d: str, content: ContentStore, desc: mf.Descriptor,
                         extra_blobs: list[str]) -> ImageRow:
    data = _read_blob(label, d, desc)
    manifest = mf.parse_manifest(data, desc.media_type, f"{label}: manifest {desc.digest}")
    cfg_data = _read_blob(label, d, manifest.config)
    config = mf.parse_config(cfg_data, f"{label}: config {manifest.config.digest}")
    layers = layer_records(manifest, config, f"{label}: manifest {desc.digest}")
    for x in manifest.layers:
        _put(label, d, content, x)
    content.put_bytes(cfg_data, manifest.config.digest)
    content.put_bytes(data, desc.digest)
    blobs = sorted(set(extra_blobs + [desc.digest, manifest.config.digest] + [x.digest for x in manifest.layers]))
    size = desc.size + manifest.config.size + sum(x.size for x in manifest.layers)
    return ImageRow(manifest.config.digest, desc.digest, desc.media_type, cfg_data, layers, blobs, size, False,
                    time.time())


def _read_oci(label: str, d: str, content: ContentStore, platform: mf.Platform,
              all_platforms: bool) -> list[ImportedImage]:
    layout = _load_json(label, os.path.join(d, "oci-layout"))
    if not isinstance(layout, dict) or layout.get("imageLayoutVersion") != "1.0.0":
        raise ArchiveError(label, "oci-layout: imageLayoutVersion must be 1.0.0")
    with open(os.path.join(d, "index.json"), "rb") as f:
        raw = f.read()
    try:
        index = mf.parse_index(raw, mf.OCI_INDEX, f"{label}: index.json")
    except InvalidManifest as e:
        raise ArchiveError(label, str(e)) from None
    out: list[ImportedImage] = []
    for desc in index.manifests:
        hints = [desc.annotations[k] for k in (CONTAINERD_NAME, REF_NAME) if desc.annotations.get(k)]
        if CONTAINERD_NAME in desc.annotations:
            hints = [desc.annotations[CONTAINERD_NAME]]
        if desc.media_type in mf.INDEX_TYPES:
            inner_data = _read_blob(label, d, desc)
            inner = mf.parse_index(inner_data, desc.media_type, f"{label}: index {desc.digest}")
            if all_platforms:
                chosen = [m for m in inner.manifests if m.media_type in mf.MANIFEST_TYPES]
            else:
                chosen = [mf.select_platform(inner, platform, f"{label}: index {desc.digest}")]
            content.put_bytes(inner_data, desc.digest)
            for m in chosen:
                row = _image_from_manifest(label, d, content, m, [desc.digest])
                out.append(ImportedImage(row, desc.digest, hints))
        elif desc.media_type in mf.MANIFEST_TYPES:
            if desc.platform is not None and not all_platforms and mf.platform_rank(platform, desc.platform) is None:
                log.info("%s: skipping %s for platform %s", label, desc.digest, desc.platform)
                continue
            row = _image_from_manifest(label, d, content, desc, [])
            out.append(ImportedImage(row, desc.digest, hints))
        else:
            log.info("%s: skipping index entry of type %s", label, desc.media_type)
    if not out:
        raise ArchiveError(label, f"no image for platform {platform} in the layout")
    return out


def _docker_file(label: str, d: str, rel: object) -> str:
    if not isinstance(rel, str) or not rel:
        raise ArchiveError(label, "manifest.json: file names must be strings")
    p = os.path.normpath(os.path.join(d, rel))
    if not p.startswith(os.path.abspath(d) + os.sep) or not os.path.isfile(p):
        raise ArchiveError(label, f"manifest.json names {rel!r}, which is not in the archive")
    return p


def _layer_media_type(path: str) -> str:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic[:2] == b"\x1f\x8b":
        return mf.OCI_LAYER_GZIP
    if magic == b"\x28\xb5\x2f\xfd":
        return mf.OCI_LAYER_ZSTD
    return mf.OCI_LAYER


def _read_docker(label: str, d: str, content: ContentStore) -> list[ImportedImage]:
    d = os.path.abspath(d)
    entries = _load_json(label, os.path.join(d, "manifest.json"))
    if not isinstance(entries, list) or not entries:
        raise ArchiveError(label, "manifest.json must be a non-empty list")
    out = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise ArchiveError(label, f"manifest.json[{i}] must be an object")
        cfg_path = _docker_file(label, d, e.get("Config"))
        with open(cfg_path, "rb") as f:
            cfg_data = f.read(mf.MAX_CONFIG_BYTES + 1)
        if len(cfg_data) > mf.MAX_CONFIG_BYTES:
            raise ArchiveError(label, f"{e.get('Config')}: config larger than {mf.MAX_CONFIG_BYTES} bytes")
        config = mf.parse_config(cfg_data, f"{label}: {e.get('Config')}")
        layer_files = e.get("Layers")
        if not isinstance(layer_files, list):
            raise ArchiveError(label, f"manifest.json[{i}].Layers must be a list")
        descs = []
        for lf in layer_files:
            p = _docker_file(label, d, lf)
            info = content.put_file(p, what=f"{label}: {lf}")
            descs.append(mf.Descriptor(_layer_media_type(p), info.digest, info.size))
        cfg_digest = content.put_bytes(cfg_data)
        man = {"schemaVersion": 2, "mediaType": mf.OCI_MANIFEST,
               "config": {"mediaType": mf.OCI_CONFIG, "digest": cfg_digest, "size": len(cfg_data)},
               "layers": [x.to_json() for x in descs]}
        man_data = json.dumps(man, sort_keys=True, separators=(",", ":")).encode()
        man_digest = content.put_bytes(man_data)
        manifest = mf.parse_manifest(man_data, mf.OCI_MANIFEST, f"{label}: manifest.json[{i}]")
        layers = layer_records(manifest, config, f"{label}: manifest.json[{i}]")
        size = len(man_data) + len(cfg_data) + sum(x.size for x in descs)
        blobs = sorted({man_digest, cfg_digest} | {x.digest for x in descs})
        row = ImageRow(cfg_digest, man_digest, mf.OCI_MANIFEST, cfg_data, layers, blobs, size, False, time.time())
        tags = e.get("RepoTags") or []
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise ArchiveError(label, f"manifest.json[{i}].RepoTags must be a list of strings")
        out.append(ImportedImage(row, man_digest, list(tags)))
    return out


def names_for(img: ImportedImage, explicit: list[Reference], base_name: str | None) -> list[tuple[str, str]]:
    """Names to record for an imported image: --name references, else the archive's own (bare tags only
    with a base name)."""
    if explicit:
        return [(str(r), img.top_digest) for r in explicit]
    out = []
    for h in img.hints:
        try:
            if "/" in h or ":" in h or "@" in h:
                ref = parse(h)
            elif base_name:
                ref = parse(f"{base_name}:{h}")
            else:
                continue
        except InvalidReference as e:
            log.warning("ignoring name %r in archive: %s", h, e)
            continue
        out.append((str(ref), img.top_digest))
    return out


# -- writing ------------------------------------------------------------------------------------------------

def write_archive(recs: list[tuple[ImageRecord, ImageRow, list[str]]], content: ContentStore, path: str,
                  fmt: str) -> None:
    if fmt not in ("oci", "oci-dir", "docker"):
        raise ArchiveError(path, f"unknown export format {fmt!r} (oci, oci-dir, docker)")
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if fmt == "oci-dir":
        if os.path.exists(path) and os.listdir(path):
            raise ArchiveError(path, "export directory exists and is not empty")
        os.makedirs(path, exist_ok=True)
        _write_oci(recs, content, path)
        return
    work = tempfile.mkdtemp(prefix=".export-", dir=parent)
    try:
        if fmt == "oci":
            _write_oci(recs, content, work)
        else:
            _write_docker(recs, content, work)
        tmp_tar = os.path.join(work, ".archive.tar")
        with tarfile.open(tmp_tar, "w", format=tarfile.PAX_FORMAT) as tf:
            for root, dirs, files in os.walk(work):
                dirs.sort()
                for name in sorted(files):
                    full = os.path.join(root, name)
                    if full == tmp_tar:
                        continue
                    ti = tf.gettarinfo(full, os.path.relpath(full, work))
                    ti.uid = ti.gid = 0
                    ti.uname = ti.gname = ""
                    ti.mtime = 0
                    with open(full, "rb") as f:
                        tf.addfile(ti, f)
        os.replace(tmp_tar, path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _copy_blob(content: ContentStore, digest: str, dest_dir: str) -> None:
    algo, hexpart = digest.split(":", 1)
    os.makedirs(os.path.join(dest_dir, "blobs", algo), exist_ok=True)
    dst = os.path.join(dest_dir, "blobs", algo, hexpart)
    if not os.path.exists(dst):
        src = content.path(digest)
        if not os.path.exists(src):
            raise ImageError(f"export: blob {digest} is missing from the content store")
        shutil.copyfile(src, dst)


def _write_oci(recs: list[tuple[ImageRecord, ImageRow, list[str]]], content: ContentStore, d: str) -> None:
    manifests = []
    for rec, row, tags in recs:
        for digest in [row.manifest_digest, rec.id] + [x.digest for x in rec.layers]:
            _copy_blob(content, digest, d)
        msize = content.size(row.manifest_digest) or 0
        base = {"mediaType": row.manifest_media_type, "digest": row.manifest_digest, "size": msize,
                "platform": {"os": rec.config.os or "linux", "architecture": rec.config.architecture or "amd64"}}
        if not tags:
            manifests.append(base)
        for t in tags:
            ref = parse(t)
            manifests.append({**base, "annotations": {CONTAINERD_NAME: t, REF_NAME: ref.tag or ref.object}})
    with open(os.path.join(d, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "mediaType": mf.OCI_INDEX, "manifests": manifests}, f, sort_keys=True)


def _write_docker(recs: list[tuple[ImageRecord, ImageRow, list[str]]], content: ContentStore, d: str) -> None:
    entries = []
    repositories: dict[str, dict[str, str]] = {}
    for rec, row, tags in recs:
        cfg_name = rec.id.split(":", 1)[1] + ".json"
        with open(os.path.join(d, cfg_name), "wb") as f:
            f.write(content.read(rec.id))
        layer_names = []
        for x in rec.layers:
            hexpart = x.diff_id.split(":", 1)[1]
            ldir = os.path.join(d, hexpart)
            os.makedirs(ldir, exist_ok=True)
            dst = os.path.join(ldir, "layer.tar")
            if not os.path.exists(dst):
                with open_decompressed(content.path(x.digest), "auto") as src, open(dst, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                got, _n = hash_file(dst)
                if got != x.diff_id:
                    raise ContentError(f"export: layer {x.digest} decompresses to {got}, config says {x.diff_id}")
            layer_names.append(f"{hexpart}/layer.tar")
        familiar = [parse(t).familiar() for t in tags]
        entries.append({"Config": cfg_name, "RepoTags": familiar or None, "Layers": layer_names})
        if rec.layers:
            for t in familiar:
                repo, _, tag = t.rpartition(":")
                repositories.setdefault(repo, {})[tag] = rec.layers[-1].diff_id.split(":", 1)[1]
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(entries, f)
    if repositories:
        with open(os.path.join(d, "repositories"), "w") as f:
            json.dump(repositories, f)
