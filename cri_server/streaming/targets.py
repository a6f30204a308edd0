"""What the husk streaming backend asks husk-cri's store: where a container's shim is, and a pod's netns.

Owns the two records husk-cri fills in (ContainerTarget, StreamTargets). Must not look anything up
itself: husk-cri implements StreamTargets from its own store.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class ContainerTarget:
    """One container as the streaming backend needs to know it."""

    container_id: str  # the CRI container id (= the shim's task id)
    shim_address: str  # unix socket of the container's shim ("unix://" prefix optional)
    running: bool
    tty: bool  # the container was created with a tty
    stdin: bool  # the container was created with stdin open
    # The container's CRI StdinOnce: a non-TTY attach session that ends its stdin closes the
    # container's stdin (containerd's behaviour; the shim also closes it when the first client detaches).
    stdin_once: bool = False


@runtime_checkable
class StreamTargets(Protocol):
    """husk-cri's view of its containers and sandboxes, for HuskStreamBackend."""

    async def container(self, container_id: str) -> ContainerTarget | None:
        """The container, or None when husk-cri does not know it."""

    async def sandbox_netns(self, sandbox_id: str) -> str | None:
        """The path of the sandbox's network namespace; "" for a host-network pod; None when the
        sandbox is unknown."""
