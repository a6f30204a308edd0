"""Garbage collection: blobs no image references, layers no image or writable snapshot needs, and leftovers of
interrupted work. Runs only under the exclusive GC lock (no pull, import or prepare in flight, in any process).
"""
from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass

from .content import ContentStore
from .metadata import MetadataDB
from .snapshots import Snapshotter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GCPlan:
    blobs: list[str]
    layer_ids: list[int]
    layer_dirs: list[str]
    active_dirs: list[str]


@dataclass(frozen=True)
class GCResult:
    blobs: int = 0
    layers: int = 0
    bytes_freed: int = 0
    skipped: bool = False  # the lock was busy (a pull or import is running); nothing was done


def plan(db: MetadataDB, content: ContentStore, snapshots: Snapshotter) -> GCPlan:
    """What to delete (database reads only; call on the thread that owns `db`)."""
    live_blobs: set[str] = set()
    live_chains: set[str] = set()
    for img in db.images():
        live_blobs.update(img.blobs)
        live_chains.update(str(x["chainID"]) for x in img.layers)
    actives = db.actives()
    for a in actives:
        live_chains.update(a.chain)
    dead_blobs = [b.digest for b in content.list() if b.digest not in live_blobs]
    layers = db.layers()
    dead_layers = [r.id for r in layers if r.chain_id not in live_chains or r.state != "ready"]
    known_layer_dirs = {str(r.id) for r in layers}
    orphans = [os.path.join(snapshots.layers_dir, n) for n in os.listdir(snapshots.layers_dir)
               if n not in known_layer_dirs]
    known_active = {str(a.id) for a in actives}
    orphan_active = [os.path.join(snapshots.active_dir, n) for n in os.listdir(snapshots.active_dir)
                     if n not in known_active]
    return GCPlan(dead_blobs, dead_layers, orphans, orphan_active)


def execute(p: GCPlan, content: ContentStore, snapshots: Snapshotter, tmp_dir: str | None = None) -> tuple[int, int]:
    """Delete files of a plan whose rows are already gone (blocking: run in a worker thread).
    Returns (blobs removed, bytes freed by blobs and by partial downloads in the ingest directory)."""
    freed = 0
    n = 0
    for d in p.blobs:
        sz = content.size(d) or 0
        if content.delete(d):
            n += 1
            freed += sz
    for d in [snapshots.layer_dir(i) for i in p.layer_ids] + p.layer_dirs + p.active_dirs:
        if os.path.ismount(d):
            log.warning("gc: %s is mounted; leaving it", d)
            continue
        shutil.rmtree(d, ignore_errors=True)
    _n, ingest_freed = content.clean_ingest()
    if ingest_freed:
        log.info("gc: removed %d bytes of partial or abandoned downloads", ingest_freed)
    freed += ingest_freed
    snapshots.clean_tmp()
    if tmp_dir and os.path.isdir(tmp_dir):  # imports interrupted by a crash
        for name in os.listdir(tmp_dir):
            shutil.rmtree(os.path.join(tmp_dir, name), ignore_errors=True)
    return n, freed
