"""Operator commands `husk-cri images pull|import|export|ls|rm|gc`, on the daemon's state directory (with or without
husk-cri running: both take the same file locks). A click group for the `husk-cri` command to mount; all the
work is ImageService's.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

DEFAULT_ROOT = "/var/lib/husk/cri"  # husk-cri's default --root
DEFAULT_REGISTRY_CONFIG_DIR = "/etc/husk/certs.d"

F = TypeVar("F", bound=Callable[..., Any])


def common_options(f: F) -> F:
    """--root and --registry-config-dir, given after the sub-command like the daemon's flags."""
    f = click.option("--root", default=None, envvar="HUSK_ROOT", metavar="DIR",
                     help=f"husk-cri's persistent state directory; images live in DIR/images. Default: husk-cri's"
                          f" --root if given before `images`, else {DEFAULT_ROOT}.")(f)
    f = click.option("--registry-config-dir", default=None, envvar="HUSK_REGISTRY_CONFIG_DIR", metavar="DIR",
                     help="containerd-style hosts.toml directory (DIR/<host>/hosts.toml). Default: husk-cri's"
                          f" --registry-config-dir if given before `images`, else {DEFAULT_REGISTRY_CONFIG_DIR}.")(f)
    f = click.option("--snapshotter", type=click.Choice(["auto", "overlay", "copy"]), default="auto",
                     show_default=True, help="How container root filesystems are made.")(f)
    f = click.option("--debug", is_flag=True, help="Log what happens.")(f)
    return f


def _service(root: str, registry_config_dir: str | None, snapshotter: str, debug: bool, **kw: Any):  # type: ignore[no-untyped-def]
    from .service import ImageService
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rcd = registry_config_dir if registry_config_dir and os.path.isdir(registry_config_dir) else None
    return ImageService(root, rcd, snapshot_mode=snapshotter, **kw)


def _run(coro_fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run an async command body with an ImageService; turn image errors into one-line messages."""
    @functools.wraps(coro_fn)
    def wrapper(root: str | None, registry_config_dir: str | None, snapshotter: str, debug: bool,
                **kw: Any) -> None:
        from .errors import ImageError
        # Flags of the `husk-cri` group itself (`husk-cri --root X images ls`) are the next best thing.
        ctx = click.get_current_context(silent=True)
        top = ctx.find_root().params if ctx is not None else {}
        root = root or top.get("root") or DEFAULT_ROOT
        if registry_config_dir is None:
            registry_config_dir = top.get("registry_config_dir") or DEFAULT_REGISTRY_CONFIG_DIR

        async def main() -> None:
            svc = _service(root, registry_config_dir, snapshotter, debug)
            try:
                await coro_fn(svc, **kw)
            finally:
                await svc.close()
        try:
            asyncio.run(main())
        except ImageError as e:
            raise click.ClickException(str(e)) from None
        except PermissionError as e:
            raise click.ClickException(f"{e} (run as root?)") from None
    return wrapper


class ProgressBar:
    """One line on a terminal: bytes of all layers fetched, layers unpacked."""

    def __init__(self, stream: Any = None, width: int = 30) -> None:
        self.stream = stream or sys.stderr
        self.width = width
        self.done: dict[str, int] = {}
        self.total = 0
        self.layers = 0
        self.unpacked: set[str] = set()
        self.last = 0.0
        self.ref = ""

    def __call__(self, ev: Any) -> None:
        self.ref = ev.ref
        if ev.kind == "resolved":
            self.total = ev.total
        elif ev.kind == "bytes":
            self.done[ev.digest] = ev.done
            self.layers = max(self.layers, len(self.done))
        elif ev.kind == "unpacked":
            self.unpacked.add(ev.digest)
        now = time.monotonic()
        if ev.kind in ("bytes",) and now - self.last < 0.1:
            return
        self.last = now
        self.draw(final=ev.kind == "done")

    def draw(self, final: bool = False) -> None:
        got = sum(self.done.values())
        frac = min(1.0, got / self.total) if self.total else (1.0 if final else 0.0)
        n = int(frac * self.width)
        bar = "#" * n + "-" * (self.width - n)
        self.stream.write(f"\r{self.ref}: [{bar}] {got / 1e6:6.1f}/{self.total / 1e6:.1f} MB, "
                          f"{len(self.unpacked)} layers unpacked" + ("\n" if final else ""))
        self.stream.flush()


@click.group("images")
def images() -> None:
    """Pull, import, export, list and remove images in husk-cri's state directory."""


@images.command("pull")
@click.argument("ref")
@click.option("--creds", metavar="USER[:PASSWORD]", help="Registry credentials (password prompted if omitted).")
@click.option("--platform", help="os/arch[/variant] to pull (default: this node's).")
@click.option("--plain-http", is_flag=True, help="Talk HTTP, not HTTPS, to every registry host (like ctr).")
@click.option("-q", "--quiet", is_flag=True, help="Print only the image id.")
@common_options
@_run
async def pull_cmd(svc, ref: str, creds: str | None, platform: str | None, plain_http: bool,  # type: ignore[no-untyped-def]
                   quiet: bool) -> None:
    """Pull REF (e.g. busybox, registry.k8s.io/pause:3.9, name@sha256:...)."""
    from .auth import AuthConfig
    auth = None
    if creds:
        user, sep, pw = creds.partition(":")
        if not sep:
            pw = click.prompt("Password", hide_input=True)
        auth = AuthConfig(username=user, password=pw)
    bar = ProgressBar() if sys.stderr.isatty() and not quiet else None
    rec = await svc.pull(ref, auth, platform, progress=bar, plain_http=plain_http or None)
    if quiet:
        click.echo(rec.id)
    else:
        click.echo(f"{ref}: {rec.id} ({rec.size / 1e6:.1f} MB)")


@images.command("import")
@click.argument("path", type=click.Path(exists=True))
@click.option("--name", "names", multiple=True, help="Name the (single) image REF; repeatable.")
@click.option("--base-name", help="Repository for bare tags found in an OCI layout (ref.name annotations).")
@click.option("--platform", help="os/arch[/variant] to import from a multi-platform layout.")
@click.option("--all-platforms", is_flag=True, help="Import every platform of a multi-platform layout.")
@click.option("--pin", is_flag=True, help="Pin the image (kubelet's image GC leaves it alone), e.g. the pause image.")
@common_options
@_run
async def import_cmd(svc, path: str, names: tuple[str, ...], base_name: str | None,  # type: ignore[no-untyped-def]
                     platform: str | None, all_platforms: bool, pin: bool) -> None:
    """Import an OCI image layout (directory or tar) or a docker-archive tar (docker save)."""
    recs = await svc.import_archive(path, list(names), base_name, platform, all_platforms)
    for r in recs:
        if pin:
            r = svc.set_pinned(r.id, True)
        click.echo(f"{r.id} {' '.join(r.repo_tags) or '<untagged>'}")


@images.command("build-pause")
@click.argument("ref", default="registry.k8s.io/pause:3.9")
@click.option("--catatonit", default="/usr/bin/catatonit", show_default=True, type=click.Path(),
              help="The static init to use as /pause.")
@common_options
@_run
async def build_pause_cmd(svc, ref: str, catatonit: str) -> None:  # type: ignore[no-untyped-def]
    """Build the sandbox (pause) image locally from catatonit and store it as REF, pinned (air-gapped nodes)."""
    rec = await svc.build_pause_image(ref, catatonit)
    click.echo(f"{rec.id} {' '.join(rec.repo_tags)}")


@images.command("export")
@click.argument("refs", nargs=-1, required=True)
@click.option("-o", "--output", required=True, type=click.Path(), help="Archive (or directory) to write.")
@click.option("--format", "fmt", type=click.Choice(["oci", "oci-dir", "docker"]), default="oci", show_default=True)
@common_options
@_run
async def export_cmd(svc, refs: tuple[str, ...], output: str, fmt: str) -> None:  # type: ignore[no-untyped-def]
    """Export images as an OCI layout tar, an OCI layout directory, or a docker-archive tar."""
    await svc.export(list(refs), output, fmt)


@images.command("ls")
@click.option("-q", "--quiet", is_flag=True, help="Only image ids.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per image.")
@common_options
@_run
async def ls_cmd(svc, quiet: bool, as_json: bool) -> None:  # type: ignore[no-untyped-def]
    """List images."""
    recs = svc.list()
    if quiet:
        for r in recs:
            click.echo(r.id)
        return
    if as_json:
        for r in recs:
            click.echo(json.dumps({"id": r.id, "repoTags": list(r.repo_tags), "repoDigests": list(r.repo_digests),
                                   "size": r.size, "uid": r.uid, "username": r.username, "pinned": r.pinned}))
        return
    rows = [("IMAGE", "TAG", "IMAGE ID", "SIZE")]
    for r in recs:
        tags = r.repo_tags or ("<none>:<none>",)
        for t in tags:
            repo, _, tag = t.rpartition(":") if ":" in t.rsplit("/", 1)[-1] else (t, "", "<none>")
            rows.append((repo, tag, r.id[7:20], f"{r.size / 1e6:.1f}MB"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


@images.command("rm")
@click.argument("refs", nargs=-1, required=True)
@click.option("--wait", "wait_s", default=60.0, show_default=True,
              help="Seconds to wait for running pulls before collecting garbage.")
@common_options
@_run
async def rm_cmd(svc, refs: tuple[str, ...], wait_s: float) -> None:  # type: ignore[no-untyped-def]
    """Remove images (every tag of each); free their disk space."""
    missing = []
    for ref in refs:
        rec = svc.get(ref)
        if rec is None:
            missing.append(ref)
            continue
        await svc.remove(rec.id, collect=False)
        click.echo(f"removed {rec.id} {' '.join(rec.repo_tags)}")
    try:
        res = await asyncio.wait_for(svc.gc(wait=True), wait_s)
        if res.blobs or res.layers:
            click.echo(f"freed {res.bytes_freed / 1e6:.1f} MB ({res.blobs} blobs, {res.layers} layers)")
    except TimeoutError:
        click.echo("a pull or import is running; space is freed by the next garbage collection", err=True)
    if missing:
        raise click.ClickException(f"no such image: {', '.join(missing)}")


@images.command("gc")
@common_options
@_run
async def gc_cmd(svc) -> None:  # type: ignore[no-untyped-def]
    """Delete blobs and unpacked layers no image or container needs."""
    res = await svc.gc(wait=True)
    click.echo(f"freed {res.bytes_freed / 1e6:.1f} MB ({res.blobs} blobs, {res.layers} layers)")


def main() -> None:  # `python -m cri_server.images.cli ...` for tests and when husk-cri is not installed
    images(prog_name="husk-cri images")


if __name__ == "__main__":
    main()
