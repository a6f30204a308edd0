"""Image references: parsing and normalising docker-style names the way docker and containerd do.

`busybox` -> `docker.io/library/busybox:latest`; `name:tag@digest` keeps only the digest (containerd's
ParseDockerRef). Pure string handling: no I/O, no registry knowledge beyond the docker.io defaults.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .errors import InvalidReference

DEFAULT_DOMAIN = "docker.io"
LEGACY_DEFAULT_DOMAIN = "index.docker.io"
OFFICIAL_REPO_PREFIX = "library/"
DEFAULT_TAG = "latest"
NAME_TOTAL_LENGTH_MAX = 255

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_PATH_RE = re.compile(rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*")
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_RE = re.compile(rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?")
_TAG_RE = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
_DIGEST_RE = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
_HEX64_RE = re.compile(r"[a-f0-9]{64}")
_DIGEST_HEX_LEN = {"sha256": 64, "sha384": 96, "sha512": 128}


def validate_digest(digest: str, what: str = "digest") -> str:
    """Return `digest` if it is `algorithm:hex` with a known algorithm and the right length, else raise."""
    if not _DIGEST_RE.fullmatch(digest):
        raise InvalidReference(digest, f"{what} is not of the form algorithm:hex")
    algo, hexpart = digest.split(":", 1)
    want = _DIGEST_HEX_LEN.get(algo)
    if want is None:
        raise InvalidReference(digest, f"{what} uses unsupported algorithm {algo!r}")
    if len(hexpart) != want or hexpart != hexpart.lower():
        raise InvalidReference(digest, f"{what} must be {want} lowercase hex digits for {algo}")
    return digest


def is_digest(s: str) -> bool:
    try:
        validate_digest(s)
    except InvalidReference:
        return False
    return True


@dataclass(frozen=True)
class Reference:
    """A normalised reference. `tag` and `digest` are never both set (the digest wins)."""

    domain: str
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        """`domain/path`, the repository name without tag or digest."""
        return f"{self.domain}/{self.path}"

    @property
    def object(self) -> str:
        """What goes after /manifests/ in a registry URL: the digest if set, else the tag."""
        return self.digest or self.tag or DEFAULT_TAG

    def __str__(self) -> str:
        if self.digest:
            return f"{self.name}@{self.digest}"
        if self.tag:
            return f"{self.name}:{self.tag}"
        return self.name

    def with_digest(self, digest: str) -> Reference:
        return replace(self, tag=None, digest=validate_digest(digest))

    def with_tag(self, tag: str) -> Reference:
        if not _TAG_RE.fullmatch(tag):
            raise InvalidReference(tag, "invalid tag format")
        return replace(self, tag=tag, digest=None)

    def familiar(self) -> str:
        """The short form docker prints (`busybox:latest`), for messages only."""
        path = self.path
        if self.domain == DEFAULT_DOMAIN:
            if path.startswith(OFFICIAL_REPO_PREFIX) and "/" not in path[len(OFFICIAL_REPO_PREFIX):]:
                path = path[len(OFFICIAL_REPO_PREFIX):]
            base = path
        else:
            base = f"{self.domain}/{path}"
        if self.digest:
            return f"{base}@{self.digest}"
        return f"{base}:{self.tag}" if self.tag else base


def _split_domain(name: str) -> tuple[str, str]:
    i = name.find("/")
    if i == -1 or (not any(c in name[:i] for c in ".:") and name[:i] != "localhost"):
        domain, rest = DEFAULT_DOMAIN, name
    else:
        domain, rest = name[:i], name[i + 1:]
    if domain == LEGACY_DEFAULT_DOMAIN:
        domain = DEFAULT_DOMAIN
    if domain == DEFAULT_DOMAIN and "/" not in rest:
        rest = OFFICIAL_REPO_PREFIX + rest
    return domain, rest


def parse(ref: str, default_tag: str | None = DEFAULT_TAG) -> Reference:
    """Parse and normalise `ref`. Without tag or digest, `default_tag` is added (None: leave it bare)."""
    if not isinstance(ref, str) or not ref:
        raise InvalidReference(str(ref), "empty reference")
    if ref != ref.strip():
        raise InvalidReference(ref, "surrounding whitespace")
    if _HEX64_RE.fullmatch(ref):
        raise InvalidReference(ref, "a 64-character hexadecimal string is an image id, not a repository name")
    rest = ref
    digest = None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        validate_digest(digest)
    tag = None
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1:]
        if not _TAG_RE.fullmatch(tag):
            raise InvalidReference(ref, f"invalid tag {tag!r}")
    if not rest:
        raise InvalidReference(ref, "missing repository name")
    domain, path = _split_domain(rest)
    if not _DOMAIN_RE.fullmatch(domain):
        raise InvalidReference(ref, f"invalid registry host {domain!r}")
    if path != path.lower():
        raise InvalidReference(ref, "repository name must be lowercase")
    if not _PATH_RE.fullmatch(path):
        raise InvalidReference(ref, f"invalid repository path {path!r}")
    if len(domain) + 1 + len(path) > NAME_TOTAL_LENGTH_MAX:
        raise InvalidReference(ref, f"repository name longer than {NAME_TOTAL_LENGTH_MAX} characters")
    if digest:
        tag = None
    elif tag is None:
        tag = default_tag
    return Reference(domain, path, tag, digest)


def try_parse(ref: str) -> Reference | None:
    try:
        return parse(ref)
    except InvalidReference:
        return None
