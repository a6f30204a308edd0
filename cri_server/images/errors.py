"""The image subsystem's exceptions: each names the object (reference, digest, path, host) and the reason.

Each class carries `code`, the name of the gRPC status code the CRI layer should answer with
(`grpc.StatusCode[err.code]`); this module imports nothing but the stdlib.
"""
from __future__ import annotations


class ImageError(Exception):
    """Base class; `str(err)` is the message a user sees."""

    code = "UNKNOWN"


class InvalidReference(ImageError):
    code = "INVALID_ARGUMENT"

    def __init__(self, ref: str, reason: str) -> None:
        super().__init__(f"invalid image reference {ref!r}: {reason}")
        self.ref = ref
        self.reason = reason


class NotFound(ImageError):
    """The image (locally), or a manifest/blob (in every configured registry host), does not exist."""

    code = "NOT_FOUND"


class Unauthorized(ImageError):
    """The registry wants credentials and none were given, or the ones given were refused."""

    code = "UNAUTHENTICATED"


class Denied(ImageError):
    """The registry knows who we are and refuses access."""

    code = "PERMISSION_DENIED"


class RegistryError(ImageError):
    """Transport failure or unexpected answer from a registry host (after retries)."""

    code = "UNAVAILABLE"


class ConfigError(ImageError):
    """A hosts.toml (or other local configuration) is malformed."""

    code = "FAILED_PRECONDITION"

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class ContentError(ImageError):
    """Fetched or imported content is not what its descriptor promised."""

    code = "DATA_LOSS"


class DigestMismatch(ContentError):
    def __init__(self, what: str, expected: str, actual: str) -> None:
        super().__init__(f"{what}: digest mismatch: expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


class SizeMismatch(ContentError):
    def __init__(self, what: str, expected: int, actual: int) -> None:
        super().__init__(f"{what}: size mismatch: expected {expected} bytes, got {actual}")
        self.expected = expected
        self.actual = actual


class ShortRead(ContentError):
    """The stream ended before the descriptor's size; the partial data is kept for a resume."""

    code = "UNAVAILABLE"

    def __init__(self, what: str, expected: int, actual: int) -> None:
        super().__init__(f"{what}: truncated: got {actual} of {expected} bytes")
        self.expected = expected
        self.actual = actual


class InvalidManifest(ImageError):
    """A manifest, index or image config is malformed or of an unsupported type."""

    code = "INVALID_ARGUMENT"

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.what = what
        self.reason = reason


class PlatformNotFound(NotFound):
    def __init__(self, ref: str, platform: str, available: list[str]) -> None:
        avail = ", ".join(available) or "none"
        super().__init__(f"{ref}: no manifest for platform {platform} (available: {avail})")
        self.platform = platform
        self.available = available


class InvalidLayer(ImageError):
    """A layer is not a well-formed tar stream (bad header, checksum, truncated)."""

    code = "INVALID_ARGUMENT"

    def __init__(self, layer: str, reason: str) -> None:
        super().__init__(f"layer {layer}: {reason}")
        self.layer = layer
        self.reason = reason


class UnsafeLayer(InvalidLayer):
    """A layer member would be written outside the snapshot (`..`, absolute path, through a symlink)."""

    def __init__(self, layer: str, member: str, reason: str) -> None:
        super().__init__(layer, f"member {member!r}: {reason}")
        self.member = member


class SnapshotError(ImageError):
    code = "INTERNAL"


class SnapshotNotFound(SnapshotError):
    code = "NOT_FOUND"

    def __init__(self, key: str) -> None:
        super().__init__(f"snapshot {key!r} does not exist")
        self.key = key


class SnapshotExists(SnapshotError):
    code = "ALREADY_EXISTS"

    def __init__(self, key: str) -> None:
        super().__init__(f"snapshot {key!r} already exists")
        self.key = key


class ArchiveError(ImageError):
    """An archive given to import (OCI layout, docker-archive) is malformed, or an export target is unusable."""

    code = "INVALID_ARGUMENT"

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class NoSpace(ImageError):
    """The filesystem under the image root is full (ENOSPC, EDQUOT, SQLITE_FULL): what was being written, where,
    how much was needed (when known) and how much is free. Whatever was half-written is removed."""

    code = "RESOURCE_EXHAUSTED"

    def __init__(self, what: str, path: str, needed: int | None = None, written: int | None = None) -> None:
        free = _free_bytes(path)
        parts = [f"{what}: no space left on device writing {path}"]
        if needed is not None:
            parts.append(f"needed {needed} bytes" + (f", wrote {written}" if written is not None else ""))
        elif written is not None:
            parts.append(f"wrote {written} bytes")
        if free is not None:
            parts.append(f"{free} bytes free")
        super().__init__("; ".join(parts))
        self.what = what
        self.path = path
        self.needed = needed
        self.written = written
        self.free = free


NO_SPACE_ERRNOS = frozenset({28, 122})  # ENOSPC, EDQUOT
_SQLITE_FULL = 13


def is_no_space(e: BaseException) -> bool:
    """Whether `e` means "the disk is full": NoSpace, ENOSPC/EDQUOT from the kernel, SQLITE_FULL from SQLite."""
    if isinstance(e, NoSpace):
        return True
    if isinstance(e, OSError):
        return e.errno in NO_SPACE_ERRNOS
    if type(e).__module__ == "sqlite3" and getattr(e, "sqlite_errorcode", None) is not None:
        return (e.sqlite_errorcode & 0xFF) == _SQLITE_FULL  # type: ignore[attr-defined]
    return False


def _free_bytes(path: str) -> int | None:
    import os
    p = path
    while p and not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    try:
        st = os.statvfs(p or "/")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize
