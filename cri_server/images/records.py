"""ImageRecord, what the CRI layer reads about an image (ListImages, ImageStatus, CreateContainer), built from
metadata rows. No I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .manifest import ImageConfig, parse_config
from .metadata import ImageRow, NameRow
from .reference import Reference, parse


def split_user(user: str) -> tuple[int | None, str]:
    """The image config's User as CRI wants it: (uid, "") for a numeric user, (None, name) for a name.

    `1002` -> (1002, ""); `www-data` -> (None, "www-data"); `1003:group` -> (1003, ""); "" -> (None, "").
    """
    name = user.split(":", 1)[0]
    if not name:
        return None, ""
    if name.isdigit():
        return int(name), ""
    return None, name


@dataclass(frozen=True)
class LayerInfo:
    digest: str  # compressed blob
    media_type: str
    size: int
    diff_id: str
    chain_id: str


@dataclass(frozen=True)
class ImageRecord:
    id: str  # config digest, "sha256:<hex>"
    repo_tags: tuple[str, ...]
    repo_digests: tuple[str, ...]
    size: int
    uid: int | None
    username: str
    config: ImageConfig
    manifest_digest: str
    layers: tuple[LayerInfo, ...]
    pinned: bool
    created: float
    annotations: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    @property
    def chain_ids(self) -> tuple[str, ...]:
        return tuple(x.chain_id for x in self.layers)

    @property
    def chain_id(self) -> str:
        """The top layer's chain id ('' for an image without layers)."""
        return self.layers[-1].chain_id if self.layers else ""

    # Shortcuts for the CRI layer's spec builders.
    @property
    def user(self) -> str:
        return self.config.user

    @property
    def env(self) -> tuple[str, ...]:
        return self.config.env

    @property
    def entrypoint(self) -> tuple[str, ...]:
        return self.config.entrypoint

    @property
    def cmd(self) -> tuple[str, ...]:
        return self.config.cmd

    @property
    def working_dir(self) -> str:
        return self.config.working_dir

    @property
    def exposed_ports(self) -> tuple[str, ...]:
        return self.config.exposed_ports

    @property
    def volumes(self) -> tuple[str, ...]:
        return self.config.volumes

    @property
    def labels(self) -> dict[str, str]:
        return self.config.labels

    @property
    def stop_signal(self) -> str:
        return self.config.stop_signal


def build_record(row: ImageRow, names: list[NameRow]) -> ImageRecord:
    cfg = parse_config(row.config, f"image {row.id} config")
    tags: set[str] = set()
    digests: set[str] = set()
    for n in names:
        ref: Reference = parse(n.name, default_tag=None)
        if ref.digest:
            digests.add(n.name)
        else:
            tags.add(n.name)
            digests.add(f"{ref.name}@{n.target_digest}")
    uid, username = split_user(cfg.user)
    layers = tuple(LayerInfo(str(x["digest"]), str(x["mediaType"]), int(x["size"]),  # type: ignore[call-overload]
                             str(x["diffID"]), str(x["chainID"])) for x in row.layers)
    return ImageRecord(id=row.id, repo_tags=tuple(sorted(tags)), repo_digests=tuple(sorted(digests)),
                       size=row.size, uid=uid, username=username, config=cfg, manifest_digest=row.manifest_digest,
                       layers=layers, pinned=row.pinned, created=row.created)
