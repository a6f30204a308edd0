"""One pull: resolve the reference, choose the platform's manifest, fetch config and layers into the content store,
unpack each layer once, and return the image row and names to record. Locks and records are the caller's.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import manifest as mf
from .content import ContentStore
from .errors import InvalidManifest, NoSpace, NotFound
from .metadata import ImageRow
from .reference import Reference
from .snapshots import Snapshotter
from .stream import LayerPipe

if TYPE_CHECKING:  # the registry client imports aiohttp (~0.5 s): only pulls need it
    from .registry import RegistryClient

log = logging.getLogger(__name__)

# Hooks of cri_server/prometheus.py, None unless metrics are on: on_pull(task, monotonic start) for every pull that
# does the work (the task's outcome is the pull's), on_fetched(bytes) for every layer downloaded from a registry.
on_pull: Callable[["asyncio.Task[Any]", float], None] | None = None
on_fetched: Callable[[int], None] | None = None


@dataclass(frozen=True)
class Progress:
    """A pull's progress. kind: 'resolved' (total = bytes of all layers), 'bytes' (done/total of one blob),
    'unpacked' (one layer ready), 'done'."""

    ref: str
    kind: str
    digest: str = ""
    done: int = 0
    total: int = 0


ProgressCallback = Callable[[Progress], None]


async def run_all(coros: list[Awaitable[Any]]) -> list[Any]:
    """Run concurrently; on the first failure cancel the rest and raise that failure (not an ExceptionGroup)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    if not tasks:
        return []
    try:
        _done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except asyncio.CancelledError:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    failed = next((t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None), None)
    if failed is not None:
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        exc = failed.exception()
        assert exc is not None
        raise exc
    return [t.result() for t in tasks]


def layer_records(manifest: mf.Manifest, config: mf.ImageConfig, what: str) -> list[dict[str, object]]:
    if len(config.diff_ids) != len(manifest.layers):
        raise InvalidManifest(what, f"manifest has {len(manifest.layers)} layers but the config lists "
                                    f"{len(config.diff_ids)} diff_ids")
    chains = mf.chain_ids(config.diff_ids)
    return [{"digest": layer.digest, "mediaType": layer.media_type, "size": layer.size, "diffID": d, "chainID": c}
            for layer, d, c in zip(manifest.layers, config.diff_ids, chains)]


async def unpack_layers(content: ContentStore, snapshots: Snapshotter, layers: list[dict[str, object]],
                        what: str) -> None:
    """Make every layer's snapshot ready from blobs already in the content store."""
    async def one(i: int, layer: dict[str, object]) -> None:
        digest = str(layer["digest"])
        if snapshots.ready_layer(str(layer["chainID"])) is not None:
            return
        if not content.exists(digest):
            raise NotFound(f"{what}: layer blob {digest} is not in the content store")
        await snapshots.ensure_layer(str(layer["chainID"]), str(layers[i - 1]["chainID"]) if i else "",
                                     str(layer["diffID"]), content.path(digest), "auto", f"{what} layer {digest}")
    await run_all([one(i, x) for i, x in enumerate(layers)])


async def pull(client: RegistryClient, content: ContentStore, snapshots: Snapshotter, ref: Reference,
               platform: mf.Platform, progress: ProgressCallback | None = None,
               max_concurrent_downloads: int = 3, stream: bool = True) -> tuple[ImageRow, list[tuple[str, str]]]:
    """Pull `ref`. With `stream`, each layer is unpacked while it downloads (else after)."""
    what = str(ref)
    if on_pull is not None and (task := asyncio.current_task()) is not None:
        on_pull(task, time.monotonic())
    resolved = await client.resolve(ref)
    top = resolved.descriptor
    content.put_bytes(resolved.data, top.digest, f"{what} manifest")
    blobs = [top.digest]
    hosts = client.order_hosts(ref, resolved.host)
    man_desc, man_data = top, resolved.data
    for _depth in range(2):  # an index may point to another index once (rare, but legal)
        if man_desc.media_type not in mf.INDEX_TYPES:
            break
        index = mf.parse_index(man_data, man_desc.media_type, f"{what}: index {man_desc.digest}")
        man_desc = mf.select_platform(index, platform, what)
        if content.exists(man_desc.digest):
            man_data = content.read(man_desc.digest)
        else:
            man_data = await client.fetch_manifest(ref, hosts, man_desc, f"{what}: manifest {man_desc.digest}")
            content.put_bytes(man_data, man_desc.digest, f"{what} manifest")
        blobs.append(man_desc.digest)
    if man_desc.media_type not in mf.MANIFEST_TYPES:
        raise InvalidManifest(what, f"unsupported manifest media type {man_desc.media_type!r}")
    manifest = mf.parse_manifest(man_data, man_desc.media_type, f"{what}: manifest {man_desc.digest}")
    cfg_desc = manifest.config
    if content.exists(cfg_desc.digest):
        cfg_data = content.read(cfg_desc.digest)
    else:
        cfg_data = await client.fetch_manifest(ref, hosts, cfg_desc, f"{what}: config {cfg_desc.digest}")
        content.put_bytes(cfg_data, cfg_desc.digest, f"{what} config")
    blobs.append(cfg_desc.digest)
    config = mf.parse_config(cfg_data, f"{what}: config {cfg_desc.digest}")
    if config.os and config.architecture and mf.platform_rank(platform, mf.Platform(
            config.os, config.architecture, config.variant)) is None:
        log.warning("%s: image config says %s/%s, this node wants %s", what, config.os, config.architecture,
                    platform)
    layers = layer_records(manifest, config, f"{what}: manifest {man_desc.digest}")
    if progress:
        progress(Progress(what, "resolved", man_desc.digest, 0, sum(x.size for x in manifest.layers)))

    sem = asyncio.Semaphore(max_concurrent_downloads)

    async def one(i: int, desc: mf.Descriptor) -> None:
        chain = str(layers[i]["chainID"])
        lwhat = f"{what}: layer {desc.digest}"
        if snapshots.ready_layer(chain) is not None and content.exists(desc.digest):
            if progress:
                progress(Progress(what, "bytes", desc.digest, desc.size, desc.size))
                progress(Progress(what, "unpacked", desc.digest, desc.size, desc.size))
            return

        def on_bytes(n: int) -> None:
            if progress:
                progress(Progress(what, "bytes", desc.digest, n, desc.size))

        async def download(sink: LayerPipe | None) -> str:
            async with sem:  # at most N downloads (each with the unpacking it feeds) at a time
                fetched = on_fetched is not None and not content.exists(desc.digest)
                path = await client.fetch_blob(content, ref, hosts, desc, lwhat, on_bytes, sink)
            on_bytes(desc.size)
            if fetched and on_fetched is not None:
                on_fetched(desc.size)
            return path
        parent = str(layers[i - 1]["chainID"]) if i else ""
        if stream:
            await snapshots.ensure_layer_streaming(chain, parent, str(layers[i]["diffID"]), lwhat, download)
        else:
            path = await download(None)
            await snapshots.ensure_layer(chain, parent, str(layers[i]["diffID"]), path, "auto", lwhat)
        if progress:
            progress(Progress(what, "unpacked", desc.digest, desc.size, desc.size))

    try:
        await run_all([one(i, d) for i, d in enumerate(manifest.layers)])
    except NoSpace:
        # The layers cancelled beside the one that hit the full disk keep their partials for a resume; a resume
        # needs the space they hold, so free it now (the ones another pull is still writing stay).
        freed = sum(content.discard_partial(d.digest) for d in manifest.layers)
        if freed:
            log.info("%s: removed %d bytes of partial downloads after running out of space", what, freed)
        raise
    blobs += [x.digest for x in manifest.layers]
    size = man_desc.size + cfg_desc.size + sum(x.size for x in manifest.layers)
    row = ImageRow(id=cfg_desc.digest, manifest_digest=man_desc.digest, manifest_media_type=man_desc.media_type,
                   config=cfg_data, layers=layers, blobs=sorted(set(blobs)), size=size, pinned=False,
                   created=time.time())
    names = [(str(ref), top.digest)]
    if not ref.digest:
        names.append((f"{ref.name}@{top.digest}", top.digest))
    if progress:
        progress(Progress(what, "done", cfg_desc.digest))
    return row, names
