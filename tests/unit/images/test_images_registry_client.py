"""The registry client against an in-process fake registry (aiohttp.web on 127.0.0.1): auth flows, redirects
that must not carry credentials elsewhere, retries, Range resume, mirror fallback and capabilities."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from cri_server.images import manifest as mf
from cri_server.images.auth import AuthConfig
from cri_server.images.content import ContentStore
from cri_server.images.errors import (
    Denied,
    DigestMismatch,
    NotFound,
    RegistryError,
    Unauthorized,
)
from cri_server.images.reference import parse
from cri_server.images.registry import RegistryClient, new_session

LAYER = b"layer-bytes" * 50_000
LAYER_D = "sha256:" + hashlib.sha256(LAYER).hexdigest()
CONFIG = json.dumps({"rootfs": {"type": "layers", "diff_ids": [LAYER_D]}, "config": {}}).encode()
CONFIG_D = "sha256:" + hashlib.sha256(CONFIG).hexdigest()
MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": mf.OCI_MANIFEST,
                       "config": {"mediaType": mf.OCI_CONFIG, "digest": CONFIG_D, "size": len(CONFIG)},
                       "layers": [{"mediaType": mf.OCI_LAYER_GZIP, "digest": LAYER_D, "size": len(LAYER)}]}).encode()
MANIFEST_D = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()


class Fake:
    """A tiny distribution API: repo `app`, tag `v1`. Behaviour knobs per test."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        self.auth: str | None = None  # None, "basic", "bearer"
        self.fail_first: dict[str, int] = {}  # path -> number of 503s to answer first
        self.cut_first_blob = False
        self.redirect_blobs_to: str | None = None
        self.manifest = MANIFEST
        self.has = True
        self.token_requests: list[dict[str, str]] = []
        self.port = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v2/app/manifests/{ref}", self.manifests)
        app.router.add_get("/v2/app/blobs/{digest}", self.blobs)
        app.router.add_get("/storage/{digest}", self.storage)
        app.router.add_get("/token", self.token)
        return app

    def _authorized(self, req: web.Request) -> web.Response | None:
        if self.auth is None:
            return None
        h = req.headers.get("Authorization", "")
        if self.auth == "basic":
            if h == "Basic " + base64.b64encode(b"u:p").decode():
                return None
            return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="fake"'})
        if h == "Bearer good-token":
            return None
        if h.startswith("Bearer "):
            return web.json_response({"errors": [{"code": "DENIED", "message": "no"}]}, status=401)
        return web.Response(status=401, headers={"WWW-Authenticate": (
            f'Bearer realm="http://127.0.0.1:{self.port}/token",service="fake",scope="repository:app:pull"')})

    async def token(self, req: web.Request) -> web.Response:
        self.token_requests.append({"q": req.query_string, "auth": req.headers.get("Authorization", "")})
        if req.headers.get("Authorization") != "Basic " + base64.b64encode(b"u:p").decode():
            return web.Response(status=401)
        return web.json_response({"token": "good-token", "expires_in": 60})

    def _maybe_fail(self, path: str) -> web.Response | None:
        n = self.fail_first.get(path, 0)
        if n:
            self.fail_first[path] = n - 1
            return web.Response(status=503, headers={"Retry-After": "0"})
        return None

    async def manifests(self, req: web.Request) -> web.Response:
        self.log.append(("GET", req.path, req.headers.get("Authorization")))
        if (r := self._authorized(req)) is not None:
            return r
        if (r := self._maybe_fail(req.path)) is not None:
            return r
        ref = req.match_info["ref"]
        if not self.has or ref not in ("v1", MANIFEST_D):
            return web.json_response({"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]},
                                     status=404)
        return web.Response(body=self.manifest, content_type=mf.OCI_MANIFEST,
                            headers={"Docker-Content-Digest": MANIFEST_D})

    async def blobs(self, req: web.Request) -> web.StreamResponse:
        self.log.append(("GET", req.path, req.headers.get("Authorization")))
        if (r := self._authorized(req)) is not None:
            return r
        if (r := self._maybe_fail(req.path)) is not None:
            return r
        d = req.match_info["digest"]
        if self.redirect_blobs_to:
            raise web.HTTPTemporaryRedirect(f"{self.redirect_blobs_to}/storage/{d}")
        return await self._serve(req, d)

    async def storage(self, req: web.Request) -> web.StreamResponse:
        self.log.append(("GET", req.path, req.headers.get("Authorization")))
        return await self._serve(req, req.match_info["digest"])

    async def _serve(self, req: web.Request, d: str) -> web.StreamResponse:
        body = {LAYER_D: LAYER, CONFIG_D: CONFIG}.get(d)
        if body is None:
            return web.Response(status=404)
        rng = req.headers.get("Range")
        start = int(rng[len("bytes="):].split("-")[0]) if rng else 0
        resp = web.StreamResponse(status=206 if rng else 200)
        if rng:
            resp.headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
        resp.content_length = len(body) - start
        await resp.prepare(req)
        if self.cut_first_blob and d == LAYER_D:
            self.cut_first_blob = False
            await resp.write(body[start:start + 100_000])
            req.transport.close()  # type: ignore[union-attr]
            return resp
        await resp.write(body[start:])
        return resp


async def serve(*fakes: Fake) -> list[web.AppRunner]:
    runners = []
    for f in fakes:
        runner = web.AppRunner(f.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        f.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        runners.append(runner)
    return runners


def hosts_dir(tmp_path, registry: str, *ports: int, server: int | None = None, resolve: list[bool] | None = None) -> str:  # type: ignore[no-untyped-def]
    d = tmp_path / "certs.d" / registry
    d.mkdir(parents=True, exist_ok=True)
    lines = [f'server = "http://127.0.0.1:{server or ports[-1]}"']
    for i, p in enumerate(ports):
        caps = '["pull", "resolve"]' if not resolve or resolve[i] else '["pull"]'
        lines += [f'[host."http://127.0.0.1:{p}"]', f"  capabilities = {caps}"]
    (d / "hosts.toml").write_text("\n".join(lines) + "\n")
    return str(tmp_path / "certs.d")


def with_fakes(n: int, body: Callable[..., Awaitable[None]]) -> None:
    async def main() -> None:
        fakes = [Fake() for _ in range(n)]
        runners = await serve(*fakes)
        session = new_session()
        try:
            await body(session, *fakes)
        finally:
            await session.close()
            for r in runners:
                await r.cleanup()
    asyncio.run(main())


async def _fetch_all(client: RegistryClient, store: ContentStore, ref: str) -> None:
    r = parse(ref)
    res = await client.resolve(r)
    m = mf.parse_manifest(res.data, res.descriptor.media_type)
    hosts = client.order_hosts(r, res.host)
    await client.fetch_manifest(r, hosts, m.config, "config")
    await client.fetch_blob(store, r, hosts, m.layers[0], "layer")


def test_resolve_fetch_and_retry(tmp_path):
    async def body(session, fake):  # type: ignore[no-untyped-def]
        fake.fail_first = {"/v2/app/manifests/v1": 2, f"/v2/app/blobs/{LAYER_D}": 1}
        fake.cut_first_blob = True
        client = RegistryClient(session, hosts_dir(tmp_path, "reg.test", fake.port), backoff=0.001)
        store = ContentStore(str(tmp_path / "cs"))
        await _fetch_all(client, store, "reg.test/app:v1")
        assert store.read(LAYER_D, max_size=len(LAYER)) == LAYER
        gets = [p for m, p, _a in fake.log if p.endswith(LAYER_D)]
        assert len(gets) == 3  # 503, cut after 100000 bytes, resumed
    with_fakes(1, body)


def test_bearer_flow_and_redirect_drops_credentials(tmp_path):
    async def body(session, reg, storage):  # type: ignore[no-untyped-def]
        reg.auth = "bearer"
        reg.redirect_blobs_to = f"http://127.0.0.1:{storage.port}"
        client = RegistryClient(session, hosts_dir(tmp_path, "reg.test", reg.port), AuthConfig(username="u", password="p"))
        store = ContentStore(str(tmp_path / "cs"))
        await _fetch_all(client, store, "reg.test/app:v1")
        assert store.exists(LAYER_D)
        assert reg.token_requests and "scope=repository:app:pull" in reg.token_requests[0]["q"]
        assert all(a is None for _m, _p, a in storage.log)  # the storage host never saw the token
        assert any(a == "Bearer good-token" for _m, _p, a in reg.log)
    with_fakes(2, body)


def test_auth_errors(tmp_path):
    async def body(session, reg):  # type: ignore[no-untyped-def]
        certs = hosts_dir(tmp_path, "reg.test", reg.port)
        reg.auth = "basic"
        with pytest.raises(Unauthorized, match="requires credentials"):
            await RegistryClient(session, certs).resolve(parse("reg.test/app:v1"))
        with pytest.raises(Unauthorized, match="refused"):
            await RegistryClient(session, certs, AuthConfig(username="u", password="x")).resolve(parse("reg.test/app:v1"))
        await RegistryClient(session, certs, AuthConfig(username="u", password="p")).resolve(parse("reg.test/app:v1"))
        reg.auth = "bearer"
        with pytest.raises(Unauthorized, match="token server"):
            await RegistryClient(session, certs).resolve(parse("reg.test/app:v1"))
        with pytest.raises(Denied):
            await RegistryClient(session, certs, AuthConfig(registry_token="wrong")).resolve(parse("reg.test/app:v1"))
        await RegistryClient(session, certs, AuthConfig(registry_token="good-token")).resolve(parse("reg.test/app:v1"))
    with_fakes(1, body)


def test_mirror_fallback_and_capabilities(tmp_path):
    async def body(session, mirror, upstream):  # type: ignore[no-untyped-def]
        mirror.has = False
        certs = hosts_dir(tmp_path, "reg.test", mirror.port, upstream.port)
        res = await RegistryClient(session, certs).resolve(parse("reg.test/app:v1"))
        assert res.host.host == f"127.0.0.1:{upstream.port}"
        assert [p for _m, p, _a in mirror.log] == ["/v2/app/manifests/v1"]
        # a host without "resolve" is not asked for tags, but is asked for digests
        mirror.has = True
        mirror.log.clear()
        certs = hosts_dir(tmp_path, "reg2.test", mirror.port, upstream.port, resolve=[False, True])
        await RegistryClient(session, certs).resolve(parse("reg2.test/app:v1"))
        assert mirror.log == []
        res = await RegistryClient(session, certs).resolve(parse(f"reg2.test/app@{MANIFEST_D}"))
        assert res.host.host == f"127.0.0.1:{mirror.port}"
        # nobody has it: NotFound naming the hosts tried
        mirror.has = upstream.has = False
        with pytest.raises(NotFound, match=str(upstream.port)):
            await RegistryClient(session, certs).resolve(parse(f"reg2.test/app@{MANIFEST_D}"))
    with_fakes(2, body)


def test_digest_checks(tmp_path):
    async def body(session, reg):  # type: ignore[no-untyped-def]
        certs = hosts_dir(tmp_path, "reg.test", reg.port)
        reg.manifest = MANIFEST + b" "
        with pytest.raises(DigestMismatch, match="Docker-Content-Digest"):
            await RegistryClient(session, certs).resolve(parse("reg.test/app:v1"))
        with pytest.raises(DigestMismatch):
            await RegistryClient(session, certs).resolve(parse(f"reg.test/app@{MANIFEST_D}"))
    with_fakes(1, body)


def test_unreachable_host_is_a_registry_error(tmp_path):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nobody listens there now

    async def main() -> None:
        session = new_session()
        try:
            certs = hosts_dir(tmp_path, "reg.test", port)
            with pytest.raises(RegistryError, match=str(port)):
                await RegistryClient(session, certs, retries=1, backoff=0.001).resolve(parse("reg.test/gone:v1"))
        finally:
            await session.close()
    asyncio.run(main())
