"""Docker schema2 content from the distro's docker-registry: an image pushed with `skopeo copy --format v2s2` and
a Docker manifest list (skopeo converts an OCI index with `--all --format v2s2`), pulled through the image
service behind a recording proxy on 127.0.0.1 that shows what the client asks for (Accept) and what the registry
answered (Content-Type)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from cri_server.images import manifest as mf
from cri_server.images.builder import Entry, ImageSpec, Layer, LayerCache, write_index_image
from cri_server.images.service import ImageService
from tests.support.imagetest import run
from tests.support.registry import LocalRegistry, write_hosts_toml

pytestmark = pytest.mark.root
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    accept: str
    status: int
    content_type: str


@asynccontextmanager
async def recording_proxy(upstream: str) -> AsyncIterator[tuple[str, list[Seen]]]:
    """A reverse proxy to `upstream` (host:port) on 127.0.0.1; yields (its host:port, the requests it saw)."""
    seen: list[Seen] = []
    session = aiohttp.ClientSession(auto_decompress=False, skip_auto_headers=("Accept-Encoding", "User-Agent"))

    async def forward(req: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in req.headers.items() if k.lower() not in HOP_BY_HOP}
        async with session.request(req.method, f"http://{upstream}{req.path_qs}", headers=headers,
                                   data=await req.read() or None, allow_redirects=False) as r:
            body = await r.read()
            seen.append(Seen(req.method, req.path, req.headers.get("Accept", ""), r.status,
                             r.headers.get("Content-Type", "")))
            return web.Response(status=r.status, body=body,
                                headers={k: v for k, v in r.headers.items() if k.lower() not in HOP_BY_HOP})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()
        await session.close()


def _skopeo(*args: str) -> str:
    p = subprocess.run(["skopeo", *args], capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if "proxy" not in k.lower()})
    assert p.returncode == 0, p.stderr
    return p.stdout


def _raw_manifest(reg: LocalRegistry, repo_tag: str) -> tuple[dict, str]:  # type: ignore[type-arg]
    raw = _skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{reg.addr}/{repo_tag}").encode()
    return json.loads(raw), "sha256:" + hashlib.sha256(raw).hexdigest()


@pytest.fixture
def schema2_registry(tmp_path, test_images):
    """A registry with busybox as a Docker v2s2 image and a two-platform Docker manifest list."""
    reg = LocalRegistry(str(tmp_path / "reg"))
    reg.start()
    try:
        _skopeo("copy", "--quiet", "--format", "v2s2", "--dest-tls-verify=false",
                f"oci:{test_images['busybox']}:latest", f"docker://{reg.addr}/husk-test/schema2:v1")
        layer = Layer([Entry("arch-file", "file", 0o644, data=b"per-platform layer")])
        specs = [ImageSpec(f"img-{a}", ["x"], [layer], {"Cmd": ["x"], "Labels": {"arch": a}}, architecture=a)
                 for a in ("arm64", "amd64")]
        built = write_index_image(str(tmp_path / "layouts"), "multi", specs, LayerCache())
        _skopeo("copy", "--quiet", "--all", "--format", "v2s2", "--dest-tls-verify=false",
                f"oci:{built.layout}:latest", f"docker://{reg.addr}/husk-test/schema2-list:v1")
        yield reg
    finally:
        reg.stop()


def test_docker_schema2_image_and_manifest_list(tmp_path, schema2_registry):
    reg = schema2_registry
    single, single_digest = _raw_manifest(reg, "husk-test/schema2:v1")
    listed, list_digest = _raw_manifest(reg, "husk-test/schema2-list:v1")
    assert single["mediaType"] == mf.DOCKER_MANIFEST and single["config"]["mediaType"] == mf.DOCKER_CONFIG
    assert {x["mediaType"] for x in single["layers"]} == {mf.DOCKER_LAYER_GZIP}
    assert listed["mediaType"] == mf.DOCKER_MANIFEST_LIST
    amd64 = next(m for m in listed["manifests"] if m["platform"]["architecture"] == "amd64")

    async def main() -> list[Seen]:
        async with recording_proxy(reg.addr) as (addr, seen):
            certs = str(tmp_path / "certs.d")
            write_hosts_toml(certs, "docker.io", f"http://{addr}")
            svc = ImageService(str(tmp_path / "root"), certs, retry_backoff=0.01, platform="linux/amd64")
            try:
                rec = await svc.pull("docker.io/husk-test/schema2:v1")
                assert rec.manifest_digest == single_digest
                assert rec.repo_digests == (f"docker.io/husk-test/schema2@{single_digest}",)
                assert rec.id == single["config"]["digest"] and rec.config.cmd == ("sh",)
                assert [x.media_type for x in rec.layers] == [mf.DOCKER_LAYER_GZIP] * len(single["layers"])
                assert all(svc.snapshots.ready_layer(c) for c in rec.chain_ids)
                for x in rec.layers:
                    svc.content.verify(x.digest)

                rec = await svc.pull("docker.io/husk-test/schema2-list:v1")
                assert rec.labels == {"arch": "amd64"} and rec.manifest_digest == amd64["digest"]
                assert rec.repo_digests == (f"docker.io/husk-test/schema2-list@{list_digest}",)
                arm = await svc.pull("docker.io/husk-test/schema2-list:v1", platform="linux/arm64")
                assert arm.labels == {"arch": "arm64"} and arm.id != rec.id
            finally:
                await svc.close()
            return list(seen)

    seen = run(main())
    manifests = [s for s in seen if "/manifests/" in s.path]
    assert manifests and all(s.method == "GET" for s in manifests)
    for s in manifests:
        accepted = {t.strip() for t in s.accept.split(",")}
        assert {mf.OCI_MANIFEST, mf.OCI_INDEX, mf.DOCKER_MANIFEST, mf.DOCKER_MANIFEST_LIST} <= accepted, s
    # What the registry served: Docker types only, so the client really read schema2 and the list.
    served = {s.content_type for s in manifests if s.status == 200}
    assert served == {mf.DOCKER_MANIFEST, mf.DOCKER_MANIFEST_LIST}
