"""The records the metadata store keeps for sandboxes and containers, and the filters List* applies.

Plain frozen dataclasses: no protobuf, no SQL. The CRI config a record was created from is kept as the
serialized protobuf bytes (`config`), so every field kubelet sent survives a restart unchanged.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping


class SandboxState(str, enum.Enum):
    CREATING = "creating"   # RunPodSandbox in progress: reserved, not yet listed as ready
    READY = "ready"
    NOTREADY = "notready"   # stopped, or its pause process or netns vanished


class ContainerState(str, enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    EXITED = "exited"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SandboxRecord:
    id: str
    name: str                      # the unique reservation key built from the pod metadata
    pod_name: str
    pod_uid: str
    pod_namespace: str
    attempt: int
    state: SandboxState
    created_at: int                # nanoseconds since the epoch
    runtime_handler: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    config: bytes = b""            # serialized runtime.v1.PodSandboxConfig
    netns_path: str = ""           # pinned network namespace; empty for host network
    ips: tuple[str, ...] = ()      # primary first
    pid: int = 0                   # the pause process
    shim_address: str = ""
    cgroup_parent: str = ""
    pod_dir: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)  # JSON-able details owned by later phases


@dataclass(frozen=True)
class ContainerRecord:
    id: str
    sandbox_id: str
    name: str                      # the unique reservation key
    container_name: str
    attempt: int
    state: ContainerState
    created_at: int
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    image: str = ""                # the image as the request named it
    image_ref: str = ""
    image_id: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    config: bytes = b""            # serialized runtime.v1.ContainerConfig
    log_path: str = ""
    pid: int = 0
    shim_address: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


def _labels_match(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@dataclass(frozen=True)
class SandboxFilter:
    """Every set field must match. `id` may be a unique prefix, as crictl passes truncated ids."""
    id: str = ""
    state: SandboxState | None = None
    label_selector: Mapping[str, str] = field(default_factory=dict)

    def matches(self, r: SandboxRecord) -> bool:
        return ((self.state is None or r.state == self.state)
                and _labels_match(r.labels, self.label_selector))


@dataclass(frozen=True)
class ContainerFilter:
    id: str = ""
    state: ContainerState | None = None
    sandbox_id: str = ""
    label_selector: Mapping[str, str] = field(default_factory=dict)

    def matches(self, r: ContainerRecord) -> bool:
        return ((self.state is None or r.state == self.state)
                and (not self.sandbox_id or r.sandbox_id == self.sandbox_id)
                and _labels_match(r.labels, self.label_selector))
