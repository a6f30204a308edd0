"""`husk-cri setup`: what a node needs before husk-cri serves pods, done idempotently.

The sandbox image (built locally from the distro's catatonit and imported when it is not already there, so
a node without registry access can run pods) and a default CNI config when the conf dir has none. Never
touches a registry.
"""
from __future__ import annotations

import asyncio
import os

from cri_server.config import Config


async def _ensure_sandbox_image(config: Config, catatonit: str) -> str:
    from cri_server.images.service import ImageService
    rcd = config.registry.config_dir if os.path.isdir(config.registry.config_dir) else None
    images = ImageService(config.paths.root, rcd)
    try:
        ref = config.runtime.sandbox_image
        rec = images.get(ref)
        if rec is not None:
            return f"sandbox image {ref} present ({rec.id[:19]})"
        rec = await images.build_pause_image(ref, catatonit=catatonit)
        return f"sandbox image {ref} built from {catatonit} and imported ({rec.id[:19]})"
    finally:
        await images.close()


def setup_node(config: Config, catatonit: str = "/usr/bin/catatonit") -> list[str]:
    from cri_server.daemon import prepare_dirs
    from cri_server.network import defaults
    from cri_server.network.cni import CniManager
    prepare_dirs(config)
    done = [asyncio.run(_ensure_sandbox_image(config, catatonit))]
    status = CniManager(config.cni.conf_dir, config.cni.bin_dirs, config.cni_cache_dir).status()
    if status.ready:
        done.append(f"CNI network {status.network_name} from {status.config_file}")
    else:
        written = defaults.write_default(config.cni.conf_dir)
        if written:
            done.append(f"default CNI network written: {', '.join(written)} (bridge {defaults.DEFAULT_BRIDGE}, "
                        f"{defaults.DEFAULT_SUBNET}, local traffic only)")
        else:
            done.append(f"CNI config in {config.cni.conf_dir} is not usable: {status.message}")
    return done
