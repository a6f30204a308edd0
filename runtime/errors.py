"""The runtime's exception hierarchy: every error names the object (field, path, id) and the reason.

The CLI prints these the way runc does (text or JSON log records); nothing here imports more than stdlib.
"""
from __future__ import annotations


class HuskError(Exception):
    """Base class. `str(err)` is the message a user sees."""


class ConfigError(HuskError):
    """config.json is malformed or semantically invalid; `path` is the JSON path (e.g. `linux.namespaces[2].type`)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"config.json: {path}: {reason}" if path else f"config.json: {reason}")
        self.path = path
        self.reason = reason


class ContainerNotFound(HuskError):
    def __init__(self, container_id: str) -> None:
        super().__init__(f"container {container_id!r} does not exist")
        self.container_id = container_id


class ContainerExists(HuskError):
    def __init__(self, container_id: str) -> None:
        super().__init__(f"container {container_id!r} already exists")
        self.container_id = container_id


class InvalidContainerId(HuskError):
    def __init__(self, container_id: str, reason: str) -> None:
        super().__init__(f"invalid container id {container_id!r}: {reason}")
        self.container_id = container_id


class InvalidState(HuskError):
    """The operation is not allowed in the container's current state (e.g. start on a running container)."""


class SetupError(HuskError):
    """A step of container setup failed (mount, cgroup, namespace, hook); the message names the object."""


def describe(e: BaseException) -> str:
    """A one-line message for any exception: OSError without the "[Errno N]" prefix, keeping the path."""
    if isinstance(e, OSError) and e.strerror:
        msg = e.strerror
        if e.filename and str(e.filename) not in msg:
            msg = f"{msg}: {e.filename}"
        return msg
    return str(e) or type(e).__name__
