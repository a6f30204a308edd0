"""The shared state RPC handlers work on: config, metadata store, network, policies.

One Services object per daemon; handlers receive it as their first argument. Phase 2 adds the shim client,
the image service and the streaming server here. Nothing in this module does I/O at import time.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cri_server.config import Config
from cri_server.oom import OomScorePolicy

if TYPE_CHECKING:
    from cri_server.network.cni import CniManager
    from cri_server.store.store import Store


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
