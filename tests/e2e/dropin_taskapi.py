"""containerd's own task API (containerd.services.tasks.v1.Tasks, gRPC on containerd's socket) for calls ctr
does not make, encoded with the shim's protobuf codec.

Owns only the few messages the drop-in tests send; it starts nothing and talks to a private containerd's
unix socket only.
"""
from __future__ import annotations

from dataclasses import dataclass

import grpc

import shim.pb.google  # noqa: F401 - registers google.protobuf.Timestamp for DeleteResponse
from shim.protobuf import MESSAGE, STRING, UINT32, Field, Message

SERVICE = "/containerd.services.tasks.v1.Tasks"


class DeleteTaskRequest(Message):
    __slots__ = ("container_id",)
    FULL_NAME = "containerd.services.tasks.v1.DeleteTaskRequest"
    FIELDS = (Field(1, "container_id", STRING),)


class DeleteResponse(Message):
    __slots__ = ("id", "pid", "exit_status", "exited_at")
    FULL_NAME = "containerd.services.tasks.v1.DeleteResponse"
    FIELDS = (
        Field(1, "id", STRING),
        Field(2, "pid", UINT32),
        Field(3, "exit_status", UINT32),
        Field(4, "exited_at", MESSAGE, "google.protobuf.Timestamp"),
    )


@dataclass(frozen=True)
class TaskError:
    """A failed call: the gRPC status code's name and containerd's message."""

    code: str
    message: str


def delete_task(address: str, namespace: str, container_id: str,
                timeout: float = 60) -> DeleteResponse | TaskError:
    """Tasks.Delete of the container's task, as any client of containerd's API sends it: containerd passes it
    to the shim whatever the task's state (the Go client's own check that refuses a created task is not
    part of the API)."""
    with grpc.insecure_channel(f"unix://{address}") as channel:
        call = channel.unary_unary(f"{SERVICE}/Delete", request_serializer=lambda m: m.encode(),
                                   response_deserializer=DeleteResponse.decode)
        try:
            return call(DeleteTaskRequest(container_id=container_id), timeout=timeout,
                        metadata=(("containerd-namespace", namespace),))
        except grpc.RpcError as e:
            return TaskError(e.code().name, e.details() or "")
