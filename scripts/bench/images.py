"""Image benchmarks (run as root; loopback only).

  pull    time to pull and unpack the ~100 MB multi-layer test image from a local docker-registry: husk
          (`husk-cri images pull` as a process, ImageService.pull in-process, and ImageService.pull in a worker
          process as husk-cri pulls: images/pullworker.py) side by side with a private
          containerd (`ctr images pull --plain-http`), interleaved, content removed between runs.
  unpack  GNU tar (+ checking scanner and whiteout pass) vs the tarfile applier on the same image's layers.

husk runs from a byte-compiled copy of the project (PYTHONDONTWRITEBYTECODE is set on this machine). Every
process started here is stopped by its pid; temp dirs are removed. Results are printed and written as JSON.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, TOP)

IMAGE_PATH = "husk-test/big:v1"


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


def build_images(cache: str) -> dict:  # type: ignore[type-arg]
    from cri_server.images import testimages
    return testimages.build(cache, only=["big"], log=log)


def compiled_copy(dest: str) -> str:
    """A byte-compiled copy of the project's packages; returns its directory (for PYTHONPATH)."""
    for pkg in ("cri_server", "runtime", "shim"):
        shutil.copytree(os.path.join(TOP, pkg), os.path.join(dest, pkg),
                        ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-m", "compileall", "-q", dest], check=True, env=env)
    # the dependencies too: an installed venv may lack .pyc files when PYTHONDONTWRITEBYTECODE was set
    import aiohttp
    import click
    import yarl
    for mod in (aiohttp, click, yarl):
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.dirname(mod.__file__ or "")],
                       env=env, check=False, stdout=subprocess.DEVNULL)
    return dest


def _timed(cmd: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> float:
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    dt = time.monotonic() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip()[-2000:]}")
    return dt


async def _inprocess_pull(root: str, ref: str, applier: str, worker: bool = False) -> float:
    from cri_server.images.service import ImageService
    svc = ImageService(root, None, plain_http=True, applier=applier, pull_worker=worker)
    try:
        t0 = time.monotonic()
        await svc.pull(ref)
        dt = time.monotonic() - t0
        for r in svc.list():
            await svc.remove(r.id, collect=False)
        await svc.gc(wait=True)
        return dt
    finally:
        await svc.close()


def cmd_pull(a: argparse.Namespace) -> dict:  # type: ignore[type-arg]
    from tests.support.containerd import Containerd
    from tests.support.registry import LocalRegistry
    index = build_images(a.cache)
    work = tempfile.mkdtemp(prefix="husk-bench-pull-", dir=a.workdir)
    reg = LocalRegistry(os.path.join(work, "registry"))
    ctd = Containerd(os.path.join(work, "ctd"))
    os.makedirs(ctd.d)
    res: dict[str, list[float]] = {"containerd": [], "husk_cli": [], "husk_inprocess": [], "husk_worker": []}
    try:
        os.makedirs(reg.workdir)
        reg.start()
        reg.push(os.path.join(a.cache, index["big"]["layout"]), IMAGE_PATH)
        ref = f"{reg.addr}/{IMAGE_PATH}"
        ctd.start()
        pkg = compiled_copy(os.path.join(work, "husk-compiled"))
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env["PYTHONPATH"] = pkg
        hroot = os.path.join(work, "husk-root")
        husk = [sys.executable, "-m", "cri_server.images.cli"]
        sys.path.insert(0, pkg)
        log(f"image {ref}: {index['big']['size'] / 1e6:.1f} MB compressed, {a.runs} runs each, interleaved")
        for i in range(a.runs + a.warmup):
            # Each timed pull starts with no dirty data of the previous one still being written back.
            os.sync()
            t_ctd = _timed(["ctr", "-a", ctd.sock, "-n", "bench", "images", "pull", "--plain-http", ref])
            rm = ctd.ctr("images", "rm", "--sync", ref)
            if rm.returncode != 0:
                raise RuntimeError(rm.stderr)
            os.sync()
            t_cli = _timed(husk + ["pull", "-q", "--plain-http", ref, "--root", hroot, "--registry-config-dir", ""],
                           env=env, cwd=work)
            _timed(husk + ["rm", ref, "--root", hroot, "--registry-config-dir", ""], env=env, cwd=work)
            os.sync()
            t_in = asyncio.run(_inprocess_pull(os.path.join(work, "husk-root-inproc"), ref, a.applier))
            os.sync()
            t_w = asyncio.run(_inprocess_pull(os.path.join(work, "husk-root-worker"), ref, a.applier, True))
            tag = "warm-up" if i < a.warmup else f"run {i - a.warmup + 1}"
            log(f"{tag}: containerd {t_ctd:.2f}s  husk cli {t_cli:.2f}s  husk in-process {t_in:.2f}s  "
                f"husk worker {t_w:.2f}s")
            if i >= a.warmup:
                res["containerd"].append(t_ctd)
                res["husk_cli"].append(t_cli)
                res["husk_inprocess"].append(t_in)
                res["husk_worker"].append(t_w)
        left = ctd.ctr("content", "ls", "-q").stdout.split()
        if left:
            log(f"note: containerd kept {len(left)} blobs after rm --sync")
    finally:
        ctd.stop()
        reg.stop()
        shutil.rmtree(work, ignore_errors=True)
    out = {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v} for k, v in res.items() if v}
    out["load_after"] = os.getloadavg()
    return out


def cmd_unpack(a: argparse.Namespace) -> dict:  # type: ignore[type-arg]
    from cri_server.images import unpack
    index = build_images(a.cache)
    layout = os.path.join(a.cache, index["big"]["layout"])
    with open(os.path.join(layout, "index.json")) as f:
        man_d = json.load(f)["manifests"][0]["digest"]
    with open(os.path.join(layout, "blobs", "sha256", man_d[7:])) as f:
        layers = [os.path.join(layout, "blobs", "sha256", x["digest"][7:]) for x in json.load(f)["layers"]]
    work = tempfile.mkdtemp(prefix="husk-bench-unpack-", dir=a.workdir)
    res: dict[str, list[float]] = {"gnutar": [], "tarfile": [], "gnutar_raw": []}
    if a.small_files:
        # A layer of many small files (the case where per-member cost dominates), instead of the image.
        from cri_server.images.builder import compress, layer_tar
        from cri_server.images.testimages import random_layer
        blob, _mt = compress(layer_tar(random_layer(7, a.small_files, 3000, 0, 0, "small").entries), "gzip")
        p = os.path.join(work, "small.tar.gz")
        with open(p, "wb") as f:
            f.write(blob)
        layers = [p]
        log(f"synthetic layer: {a.small_files} files, {len(blob) / 1e6:.1f} MB gzip")
    try:
        for i in range(a.runs):
            for name in ("gnutar", "tarfile", "gnutar_raw"):
                os.sync()
                d = os.path.join(work, f"{name}-{i}")
                t0 = time.monotonic()
                for j, p in enumerate(layers):
                    dest = os.path.join(d, str(j))
                    os.makedirs(dest)
                    if name == "gnutar_raw":  # plain `tar -xzf` with the same flags: the floor
                        subprocess.run(unpack.gnu_tar_command(dest)[:3] + [p] + unpack.gnu_tar_command(dest)[4:] +
                                       ["-z"], check=True)
                    else:
                        unpack.APPLIERS[name](p, "auto", dest, f"layer{j}")
                res[name].append(time.monotonic() - t0)
                shutil.rmtree(d)
            log(f"run {i + 1}: " + "  ".join(f"{k} {v[-1]:.2f}s" for k, v in res.items()))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v} for k, v in res.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["pull", "unpack"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--cache", default=os.path.join(TOP, ".cache", "test-images"))
    ap.add_argument("--workdir", default=None, help="where temporary roots go (default: the system temp dir)")
    ap.add_argument("--small-files", type=int, default=0,
                    help="unpack: measure one synthetic layer of this many 3 KB files instead of the image")
    ap.add_argument("--applier", default="gnutar", choices=["gnutar", "tarfile"])
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args()
    if os.geteuid() != 0:
        log("needs root (overlay snapshots, ownership, containerd)")
        return 2
    res = cmd_pull(a) if a.what == "pull" else cmd_unpack(a)
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
