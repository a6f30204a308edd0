"""The default pod network husk-cri writes when the CNI conf dir has none: local traffic only.

A bridge with host-local IPAM (the node reaches pods through the bridge address), portmap for hostPorts,
and a loopback config for other CRI servers. No default route in pods and no masquerade, so pod traffic
cannot leave the machine. This module only writes files.
"""
from __future__ import annotations

import json
import logging
import os

log = logging.getLogger(__name__)

DEFAULT_BRIDGE = "husk0"
DEFAULT_SUBNET = "10.85.0.0/16"
DEFAULT_NETWORK = "husk"
CNI_VERSION = "1.0.0"
CONFLIST_NAME = "10-husk.conflist"
LOOPBACK_NAME = "99-loopback.conf"


def default_conflist(bridge: str = DEFAULT_BRIDGE, subnet: str = DEFAULT_SUBNET,
                     network: str = DEFAULT_NETWORK, data_dir: str = "") -> dict:
    ipam: dict = {"type": "host-local", "ranges": [[{"subnet": subnet}]]}
    if data_dir:
        ipam["dataDir"] = data_dir
    return {
        "cniVersion": CNI_VERSION,
        "name": network,
        "plugins": [
            {"type": "bridge", "bridge": bridge, "isGateway": True, "isDefaultGateway": False,
             "ipMasq": False, "hairpinMode": True, "ipam": ipam},
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        ],
    }


def loopback_conf() -> dict:
    return {"cniVersion": CNI_VERSION, "name": "loopback", "type": "loopback"}


def _write_atomic(path: str, doc: dict) -> None:
    from runtime.fsutil import atomic_write  # fsync'd file, directory not: as before the shared helper
    atomic_write(path, json.dumps(doc, indent=2) + "\n", mode=0o644, sync_dir=False)


def write_default(conf_dir: str, **kw: str) -> list[str]:
    """Writes the default conflist and loopback conf unless the dir already has a network config.
    Returns the files written (empty when a config was already there)."""
    os.makedirs(conf_dir, mode=0o755, exist_ok=True)
    if any(n.endswith((".conflist", ".conf", ".json")) for n in os.listdir(conf_dir)):
        return []
    written = []
    for name, doc in ((CONFLIST_NAME, default_conflist(**kw)), (LOOPBACK_NAME, loopback_conf())):
        path = os.path.join(conf_dir, name)
        _write_atomic(path, doc)
        written.append(path)
    log.info("default CNI config written", extra={"files": written})
    return written
