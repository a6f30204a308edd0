"""The shared state RPC handlers work on: config, metadata store, locks, network, images, shims, policies.

One Services object per daemon; handlers receive it as their first argument. Tests may leave the parts
they do not need as None (a handler that needs one raises FailedPrecondition). No I/O at import time.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cri_server.config import Config
from cri_server.errors import FailedPrecondition, InvalidArgument
from cri_server.events import EventBus
from cri_server.oom import OomScorePolicy
from cri_server.store.locks import KeyedLocks

if TYPE_CHECKING:
    from cri_server.images.service import ImageService
    from cri_server.network.cni import CniManager
    from cri_server.shims import ShimManager
    from cri_server.spec.context import HostInfo
    from cri_server.store.store import Store
    from cri_server.tasks import TaskMonitor


@dataclass
class RuntimeSettings:
    """What UpdateRuntimeConfig changes at run time."""
    pod_cidr: str = ""


@dataclass
class Services:
    config: Config
    store: "Store"
    cni: "CniManager"
    oom: OomScorePolicy
    settings: RuntimeSettings = field(default_factory=RuntimeSettings)
    started_at: float = field(default_factory=time.time)
    images: "ImageService | None" = None
    shims: "ShimManager | None" = None
    host: "HostInfo | None" = None
    tasks: "TaskMonitor | None" = None
    streaming: Any = None                      # cri_server.streaming.StreamingServer, when it runs
    events: EventBus = field(default_factory=EventBus)
    locks: KeyedLocks = field(default_factory=KeyedLocks)
    default_runtime: str = "runc"             # what the shim runs for the default handler ("husk" = in-process)

    # --- the optional parts, checked where they are needed ----------------------------------
    def need_images(self) -> "ImageService":
        if self.images is None:
            raise FailedPrecondition("the image service is not running")
        return self.images

    def need_shims(self) -> "ShimManager":
        if self.shims is None:
            raise FailedPrecondition("the shim manager is not running")
        return self.shims

    def need_tasks(self) -> "TaskMonitor":
        if self.tasks is None:
            raise FailedPrecondition("the task monitor is not running")
        return self.tasks

    def runtime_for(self, handler: str) -> str:
        """The OCI runtime the shim uses for a RuntimeClass handler; unknown handlers are an error."""
        if not handler:
            return self.default_runtime
        runtime = self.config.runtime.handlers.get(handler)
        if runtime is None:
            known = ", ".join(sorted(self.config.runtime.handlers)) or "none besides the default"
            raise InvalidArgument(f"runtime_handler: no runtime handler {handler!r} is configured (known: {known})")
        return shim_runtime(runtime)

    # --- where things live ---------------------------------------------------------------------
    def bundle_dir(self, object_id: str) -> str:
        return os.path.join(self.config.paths.state, "bundles", object_id)

    def pod_dir(self, sandbox_id: str) -> str:
        return os.path.join(self.config.sandboxes_dir, sandbox_id)

    def pod_state_dir(self, sandbox_id: str) -> str:
        return os.path.join(self.config.paths.state, "sandboxes", sandbox_id)

    def container_dir(self, container_id: str) -> str:
        return os.path.join(self.config.containers_dir, container_id)


def shim_runtime(configured: str) -> str:
    """The config's runtime name as the shim understands it: "in-process" is the shim's "husk"."""
    return "husk" if configured in ("in-process", "inprocess", "husk-inprocess") else configured


def in_process_available() -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec("runtime.lifecycle") is not None
    except ImportError:
        return False
