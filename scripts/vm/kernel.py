"""Fetches the guest kernel from the distro (apt-get download + dpkg -x) into the VM cache directory.

Keeps only the kernel image and the modules the initramfs needs (with their dependencies), so the cache stays
small. Never installs anything on the host and needs no network once the cache is filled.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from initramfs import builtin_modules, module_index, resolve_modules

META_PACKAGE = "linux-image-amd64"


@dataclass(frozen=True)
class Kernel:
    package: str                       # e.g. linux-image-6.1.0-57-amd64
    version: str                       # the Debian package version, e.g. 6.1.192-3
    release: str                       # uname -r, e.g. 6.1.0-57-amd64
    vmlinuz: Path
    modules: list[tuple[str, Path]]    # in insmod order


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def resolve_package(meta: str = META_PACKAGE) -> str:
    """The versioned kernel package the meta package points to (apt-cache depends, no network)."""
    try:
        out = _run(["apt-cache", "depends", meta])
    except RuntimeError:
        out = ""
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Depends:") and "linux-image-" in line:
            return line.split(":", 1)[1].strip()
    raise RuntimeError(f"apt-cache depends {meta}: no linux-image dependency")


def _download(package: str, into: Path) -> Path:
    _run(["apt-get", "download", package], cwd=into)
    debs = sorted(into.glob(f"{package}_*.deb"))
    if not debs:
        raise RuntimeError(f"apt-get download {package}: no .deb in {into}")
    return debs[-1]


def fetch(cache: Path, wanted_modules: list[str], package: str | None = None) -> Kernel:
    """Returns the cached kernel for `package` (default: what linux-image-amd64 depends on), fetching it first
    when the cache has none or lacks one of `wanted_modules`."""
    if package is None:
        try:
            package = resolve_package()
        except RuntimeError:
            cached = sorted((cache / "kernel").glob("linux-image-*/kernel.json"))
            if cached:   # no package lists (yet): a kernel fetched before will do
                package = cached[-1].parent.name
            else:
                _run(["apt-get", "update", "-q"])      # a fresh machine may have no package lists yet
                package = resolve_package()
    kdir = cache / "kernel" / package
    meta_file = kdir / "kernel.json"
    if meta_file.exists():
        meta = json.loads(meta_file.read_text())
        if meta.get("wanted") == wanted_modules:
            return Kernel(package, meta["version"], meta["release"], kdir / "vmlinuz",
                          [(n, kdir / "modules" / f"{n}.ko") for n in meta["modules"]])
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="fetch-") as tmp:
        tmpdir = Path(tmp)
        try:
            deb = _download(package, tmpdir)
        except RuntimeError:
            _run(["apt-get", "update", "-q"])          # stale lists: the archive may have moved on
            deb = _download(package, tmpdir)
        version = deb.name.split("_")[1]
        root = tmpdir / "root"
        _run(["dpkg-deb", "-x", str(deb), str(root)])
        releases = sorted(p.name for p in (root / "lib" / "modules").iterdir())
        if len(releases) != 1:
            raise RuntimeError(f"{deb.name}: expected one lib/modules/<release>, found {releases}")
        release = releases[0]
        mdir = root / "lib" / "modules" / release
        index = module_index(mdir)
        order = resolve_modules(wanted_modules, index, builtin_modules(mdir))
        if kdir.exists():
            shutil.rmtree(kdir)
        (kdir / "modules").mkdir(parents=True)
        shutil.copy2(root / "boot" / f"vmlinuz-{release}", kdir / "vmlinuz")
        for name in order:
            shutil.copy2(index[name], kdir / "modules" / f"{name}.ko")
        meta_file.write_text(json.dumps({"version": version, "release": release, "wanted": wanted_modules,
                                         "modules": order}, indent=1))
    return Kernel(package, version, release, kdir / "vmlinuz", [(n, kdir / "modules" / f"{n}.ko") for n in order])
