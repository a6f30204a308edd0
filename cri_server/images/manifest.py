"""OCI and Docker schema2 manifests, indexes and image configs: parsing, validation, platform choice, chain ids.

Pure functions over bytes and records; fetching and storing them is the registry client's and the content
store's job.
"""
from __future__ import annotations

import hashlib
import json
import platform as _platform
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidManifest, PlatformNotFound
from .reference import InvalidReference, validate_digest

# Manifests and indexes.
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_SCHEMA1 = "application/vnd.docker.distribution.manifest.v1+json"
DOCKER_SCHEMA1_SIGNED = "application/vnd.docker.distribution.manifest.v1+prettyjws"
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEX_TYPES = (OCI_INDEX, DOCKER_MANIFEST_LIST)
ACCEPT = ", ".join((OCI_INDEX, DOCKER_MANIFEST_LIST, OCI_MANIFEST, DOCKER_MANIFEST))

# Configs.
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
CONFIG_TYPES = (OCI_CONFIG, DOCKER_CONFIG)

# Layers, with the compression each implies.
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"
LAYER_COMPRESSION = {
    OCI_LAYER: "none",
    OCI_LAYER_GZIP: "gzip",
    OCI_LAYER_ZSTD: "zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar": "none",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd": "zstd",
    DOCKER_LAYER: "none",
    DOCKER_LAYER_GZIP: "gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip": "gzip",
}

MAX_MANIFEST_BYTES = 4 * 1024 * 1024  # distribution's own limit for manifests
MAX_CONFIG_BYTES = 8 * 1024 * 1024


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Platform:
    os: str
    architecture: str
    variant: str = ""
    os_version: str = ""

    def __str__(self) -> str:
        s = f"{self.os}/{self.architecture}"
        return f"{s}/{self.variant}" if self.variant else s


_ARCH_ALIASES = {"x86_64": "amd64", "x86-64": "amd64", "aarch64": "arm64", "armhf": "arm", "armel": "arm",
                 "i386": "386", "i686": "386"}


def normalize_platform(p: Platform) -> Platform:
    arch = _ARCH_ALIASES.get(p.architecture.lower(), p.architecture.lower())
    variant = p.variant.lower()
    if p.architecture.lower() == "armhf" and not variant:
        variant = "v7"
    elif p.architecture.lower() == "armel" and not variant:
        variant = "v6"
    if arch == "arm64" and variant == "8":
        variant = "v8"
    if arch == "amd64" and variant == "v1":
        variant = ""
    return Platform(p.os.lower(), arch, variant, p.os_version)


def parse_platform(spec: str) -> Platform:
    """`os/arch[/variant]` (e.g. `linux/amd64`, `linux/arm/v7`) -> Platform."""
    parts = spec.strip().split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise InvalidManifest(f"platform {spec!r}", "expected os/arch[/variant]")
    return normalize_platform(Platform(parts[0], parts[1], parts[2] if len(parts) == 3 else ""))


def host_platform() -> Platform:
    machine = _platform.machine().lower()
    arch = _ARCH_ALIASES.get(machine, machine)
    variant = ""
    if arch == "arm64":
        variant = "v8"
    elif machine.startswith("armv"):
        arch, variant = "arm", "v" + machine[4]
    return Platform("linux", arch, variant)


def _compatible_variants(want: Platform) -> list[str]:
    """Variants of want.architecture a host of `want` can run, best first."""
    if want.architecture == "arm":
        order = ["v8", "v7", "v6", "v5"]
        start = order.index(want.variant) if want.variant in order else 1
        return order[start:]
    if want.architecture == "arm64":
        return ["v8", ""] if want.variant in ("", "v8") else [want.variant, "v8", ""]
    if want.architecture == "amd64":
        order = ["v4", "v3", "v2", ""]
        start = order.index(want.variant) if want.variant in order else 3
        return order[start:]
    return [want.variant] if want.variant else [""]


def platform_rank(want: Platform, have: Platform) -> int | None:
    """Rank of `have` for a host of `want` (0 best), or None when it cannot run there."""
    w, h = normalize_platform(want), normalize_platform(have)
    if w.os != h.os or w.architecture != h.architecture:
        return None
    variants = _compatible_variants(w)
    if h.variant not in variants:
        # arm64 and amd64 manifests often carry no variant at all; accept, ranked last.
        return len(variants) if not h.variant and w.architecture not in ("arm",) else None
    return variants.index(h.variant)


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    urls: tuple[str, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    platform: Platform | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.urls:
            d["urls"] = list(self.urls)
        if self.annotations:
            d["annotations"] = dict(self.annotations)
        if self.platform:
            p: dict[str, Any] = {"architecture": self.platform.architecture, "os": self.platform.os}
            if self.platform.variant:
                p["variant"] = self.platform.variant
            if self.platform.os_version:
                p["os.version"] = self.platform.os_version
            d["platform"] = p
        return d


def _str(obj: dict[str, Any], key: str, what: str, required: bool = True) -> str:
    v = obj.get(key)
    if v is None and not required:
        return ""
    if not isinstance(v, str):
        raise InvalidManifest(what, f"field {key!r} must be a string")
    return v


def parse_descriptor(obj: Any, what: str) -> Descriptor:
    if not isinstance(obj, dict):
        raise InvalidManifest(what, "descriptor must be an object")
    media_type = _str(obj, "mediaType", what)
    digest = _str(obj, "digest", what)
    try:
        validate_digest(digest)
    except InvalidReference as e:
        raise InvalidManifest(what, f"bad digest: {e.reason}") from None
    size = obj.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidManifest(what, "field 'size' must be a non-negative integer")
    urls = obj.get("urls") or []
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise InvalidManifest(what, "field 'urls' must be a list of strings")
    ann = obj.get("annotations") or {}
    if not isinstance(ann, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in ann.items()):
        raise InvalidManifest(what, "field 'annotations' must map strings to strings")
    plat = None
    p = obj.get("platform")
    if p is not None:
        if not isinstance(p, dict):
            raise InvalidManifest(what, "field 'platform' must be an object")
        plat = Platform(_str(p, "os", what + ".platform"), _str(p, "architecture", what + ".platform"),
                        _str(p, "variant", what + ".platform", required=False),
                        _str(p, "os.version", what + ".platform", required=False))
    return Descriptor(media_type, digest, size, tuple(urls), dict(ann), plat)


@dataclass(frozen=True)
class Index:
    media_type: str
    manifests: tuple[Descriptor, ...]
    annotations: dict[str, str] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class Manifest:
    media_type: str
    config: Descriptor
    layers: tuple[Descriptor, ...]
    annotations: dict[str, str] = field(default_factory=dict, hash=False, compare=False)


def _load_json(data: bytes, what: str, limit: int) -> dict[str, Any]:
    if len(data) > limit:
        raise InvalidManifest(what, f"larger than {limit} bytes")
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidManifest(what, f"not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise InvalidManifest(what, "not a JSON object")
    return obj


def detect_media_type(data: bytes, content_type: str | None, what: str) -> str:
    """The manifest's media type: its own `mediaType` field, else the HTTP Content-Type, else by shape."""
    obj = _load_json(data, what, MAX_MANIFEST_BYTES)
    mt = obj.get("mediaType")
    if isinstance(mt, str) and mt:
        return mt
    ct = (content_type or "").split(";", 1)[0].strip()
    if ct in MANIFEST_TYPES + INDEX_TYPES + (DOCKER_SCHEMA1, DOCKER_SCHEMA1_SIGNED):
        return ct
    if obj.get("schemaVersion") == 1:
        return DOCKER_SCHEMA1_SIGNED
    if "manifests" in obj:
        return OCI_INDEX
    if "config" in obj and "layers" in obj:
        return OCI_MANIFEST
    raise InvalidManifest(what, "cannot tell whether this is a manifest or an index")


def _check_schema(obj: dict[str, Any], media_type: str, what: str) -> None:
    if media_type in (DOCKER_SCHEMA1, DOCKER_SCHEMA1_SIGNED):
        raise InvalidManifest(what, "Docker schema 1 manifests are not supported (deprecated; re-push the image)")
    if obj.get("schemaVersion") != 2:
        raise InvalidManifest(what, f"unsupported schemaVersion {obj.get('schemaVersion')!r}")
    declared = obj.get("mediaType")
    if declared is not None and declared != media_type:
        raise InvalidManifest(what, f"mediaType {declared!r} does not match {media_type!r}")


def parse_index(data: bytes, media_type: str, what: str = "index") -> Index:
    obj = _load_json(data, what, MAX_MANIFEST_BYTES)
    _check_schema(obj, media_type, what)
    if media_type not in INDEX_TYPES:
        raise InvalidManifest(what, f"media type {media_type!r} is not an index")
    ms = obj.get("manifests")
    if not isinstance(ms, list):
        raise InvalidManifest(what, "field 'manifests' must be a list")
    descs = tuple(parse_descriptor(m, f"{what}.manifests[{i}]") for i, m in enumerate(ms))
    return Index(media_type, descs, dict(obj.get("annotations") or {}))


def parse_manifest(data: bytes, media_type: str, what: str = "manifest") -> Manifest:
    obj = _load_json(data, what, MAX_MANIFEST_BYTES)
    _check_schema(obj, media_type, what)
    if media_type not in MANIFEST_TYPES:
        raise InvalidManifest(what, f"media type {media_type!r} is not an image manifest")
    config = parse_descriptor(obj.get("config"), f"{what}.config")
    if config.media_type not in CONFIG_TYPES:
        raise InvalidManifest(f"{what}.config", f"unsupported config media type {config.media_type!r}"
                              " (not a container image)")
    layers_raw = obj.get("layers")
    if not isinstance(layers_raw, list):
        raise InvalidManifest(what, "field 'layers' must be a list")
    layers = tuple(parse_descriptor(x, f"{what}.layers[{i}]") for i, x in enumerate(layers_raw))
    for i, layer in enumerate(layers):
        if layer.media_type not in LAYER_COMPRESSION:
            raise InvalidManifest(f"{what}.layers[{i}]", f"unsupported layer media type {layer.media_type!r}")
    return Manifest(media_type, config, layers, dict(obj.get("annotations") or {}))


def select_platform(index: Index, want: Platform, ref: str) -> Descriptor:
    """The index entry that best fits `want`; entries without a platform are skipped (attestations etc.)."""
    best: tuple[int, int, Descriptor] | None = None
    available = []
    for pos, d in enumerate(index.manifests):
        if d.platform is None or d.media_type not in MANIFEST_TYPES + INDEX_TYPES:
            continue
        if d.platform.os == "unknown":
            continue
        available.append(str(d.platform))
        r = platform_rank(want, d.platform)
        if r is not None and (best is None or (r, pos) < best[:2]):
            best = (r, pos, d)
    if best is None:
        raise PlatformNotFound(ref, str(want), available)
    return best[2]


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an image config the runtime and the CRI need."""

    os: str
    architecture: str
    variant: str
    diff_ids: tuple[str, ...]
    user: str = ""
    env: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    working_dir: str = ""
    exposed_ports: tuple[str, ...] = ()
    volumes: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    stop_signal: str = ""
    created: str = ""


def _str_list(v: Any, what: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise InvalidManifest(what, "must be a list of strings")
    return tuple(v)


def _key_set(v: Any, what: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, dict):
        raise InvalidManifest(what, "must be an object")
    return tuple(sorted(str(k) for k in v))


def parse_config(data: bytes, what: str = "image config") -> ImageConfig:
    obj = _load_json(data, what, MAX_CONFIG_BYTES)
    rootfs = obj.get("rootfs")
    if not isinstance(rootfs, dict) or rootfs.get("type") != "layers":
        raise InvalidManifest(what, "rootfs.type must be 'layers'")
    diff_ids = _str_list(rootfs.get("diff_ids"), f"{what}: rootfs.diff_ids")
    for i, d in enumerate(diff_ids):
        try:
            validate_digest(d)
        except InvalidReference as e:
            raise InvalidManifest(what, f"rootfs.diff_ids[{i}]: {e.reason}") from None
    cfg = obj.get("config") or {}
    if not isinstance(cfg, dict):
        raise InvalidManifest(what, "field 'config' must be an object")
    labels = cfg.get("Labels") or {}
    if not isinstance(labels, dict):
        raise InvalidManifest(what, "config.Labels must be an object")
    for k in ("User", "WorkingDir", "StopSignal"):
        if cfg.get(k) is not None and not isinstance(cfg.get(k), str):
            raise InvalidManifest(what, f"config.{k} must be a string")
    return ImageConfig(
        os=str(obj.get("os") or ""), architecture=str(obj.get("architecture") or ""),
        variant=str(obj.get("variant") or ""), diff_ids=diff_ids,
        user=cfg.get("User") or "", env=_str_list(cfg.get("Env"), f"{what}: config.Env"),
        entrypoint=_str_list(cfg.get("Entrypoint"), f"{what}: config.Entrypoint"),
        cmd=_str_list(cfg.get("Cmd"), f"{what}: config.Cmd"), working_dir=cfg.get("WorkingDir") or "",
        exposed_ports=_key_set(cfg.get("ExposedPorts"), f"{what}: config.ExposedPorts"),
        volumes=_key_set(cfg.get("Volumes"), f"{what}: config.Volumes"),
        labels={str(k): str(v) for k, v in labels.items()}, stop_signal=cfg.get("StopSignal") or "",
        created=str(obj.get("created") or ""),
    )


def chain_ids(diff_ids: tuple[str, ...] | list[str]) -> list[str]:
    """OCI chain ids: ChainID(L0) = DiffID(L0); ChainID(Ln) = sha256(ChainID(Ln-1) + " " + DiffID(Ln))."""
    out: list[str] = []
    for d in diff_ids:
        out.append(d if not out else sha256_digest(f"{out[-1]} {d}".encode()))
    return out
