"""Errors that RPC handlers raise, each with the gRPC status code kubelet expects for it.

The servicer turns a CriError into that status; handlers never touch grpc contexts for errors. This module
imports no grpc: codes are names of grpc.StatusCode members, resolved where the status is sent.
"""
from __future__ import annotations


class CriError(Exception):
    code = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(CriError):
    """A request field is missing or malformed; the message names the field."""
    code = "INVALID_ARGUMENT"


class NotFound(CriError):
    code = "NOT_FOUND"


class AlreadyExists(CriError):
    """A name is taken; `existing_id` is the object holding it (kubelet reads it from the message)."""
    code = "ALREADY_EXISTS"

    def __init__(self, message: str, existing_id: str = "") -> None:
        super().__init__(message)
        self.existing_id = existing_id


class FailedPrecondition(CriError):
    code = "FAILED_PRECONDITION"


class Unimplemented(CriError):
    code = "UNIMPLEMENTED"


class Unavailable(CriError):
    code = "UNAVAILABLE"


class DeadlineExceeded(CriError):
    code = "DEADLINE_EXCEEDED"


class Internal(CriError):
    code = "INTERNAL"


class ResourceExhausted(CriError):
    """Out of a resource: the disk (ENOSPC), or a size limit of the answer; the message says which and how much."""
    code = "RESOURCE_EXHAUSTED"


def image_failure(message: str, e: Exception, default: type[CriError] = Internal) -> CriError:
    """`default(message)` for a failure of the image service, unless it is a full disk (images.errors.NoSpace):
    then ResourceExhausted(message), the code kubelet gets for ENOSPC wherever it happens."""
    return ResourceExhausted(message) if getattr(e, "code", "") == "RESOURCE_EXHAUSTED" else default(message)
