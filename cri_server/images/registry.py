"""Registry client (OCI distribution spec) over aiohttp: resolve references, fetch manifests and blobs.

Tries the hosts of hosts.toml in order, authenticates (Bearer token flow, Basic), follows redirects (dropping
credentials on other origins), retries transient failures with backoff and resumes blobs with Range. It reads
and writes nothing on disk itself: blobs go through the content store's ingest.
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
from yarl import URL

from . import manifest as mf
from .auth import (
    AuthConfig,
    Challenge,
    Token,
    basic_header,
    parse_challenges,
    repository_scope,
    token_from_response,
)
from .content import ContentStore, ProgressFn, Sink
from .errors import (
    ContentError,
    Denied,
    DigestMismatch,
    ImageError,
    InvalidManifest,
    NotFound,
    RegistryError,
    ShortRead,
    Unauthorized,
)
from .hostsconfig import CAP_PULL, CAP_RESOLVE, RegistryHost, registry_hosts
from .reference import Reference

log = logging.getLogger(__name__)

USER_AGENT = "husk/0.1"
CHUNK = 1 << 20
RETRY_STATUS = (408, 429, 500, 502, 503, 504)
REDIRECT_STATUS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 10


@dataclass(frozen=True)
class Resolved:
    ref: Reference
    host: RegistryHost
    descriptor: mf.Descriptor
    data: bytes


def _origin(url: URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host or "", url.port


def _error_detail(body: bytes) -> tuple[str, str]:
    """(first error code, message) from a distribution error body, or ('', '')."""
    try:
        obj = json.loads(body)
        err = obj["errors"][0]
        return str(err.get("code", "")), str(err.get("message", ""))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return "", ""


def _rank(e: Exception) -> int:
    for i, cls in enumerate((Denied, Unauthorized, ContentError, InvalidManifest, RegistryError, NotFound)):
        if isinstance(e, cls):
            return i
    return 99


def _worst(errors: list[Exception], fallback: ImageError) -> Exception:
    return min(errors, key=_rank) if errors else fallback


def auth_applies(auth: AuthConfig | None, registry: str, host: RegistryHost) -> bool:
    """Whether `auth` is meant for this endpoint: no server_address means the image's registry and its mirrors."""
    if auth is None or auth.is_empty():
        return False
    if not auth.server_address:
        return True
    sa = auth.server_address
    if "://" in sa:
        sa = sa.split("://", 1)[1]
    sa = sa.split("/", 1)[0]
    aliases = {registry, host.host}
    if registry == "docker.io":
        aliases |= {"index.docker.io", "registry-1.docker.io"}
    return sa in aliases


class RegistryClient:
    """One client per pull (credentials are per pull); the aiohttp session is shared and owned by the caller."""

    def __init__(self, session: aiohttp.ClientSession, config_dir: str | None, auth: AuthConfig | None = None,
                 plain_http: bool = False, retries: int = 3, backoff: float = 0.25,
                 connect_timeout: float = 30.0, read_timeout: float = 60.0) -> None:
        self.session = session
        self.config_dir = config_dir
        self.auth = auth
        self.plain_http = plain_http
        self.retries = retries
        self.backoff = backoff
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        self._ssl: dict[RegistryHost, ssl.SSLContext] = {}
        self._basic: dict[str, str] = {}  # host -> Authorization header
        self._bearer: dict[tuple[str, str], Token] = {}  # (host, scope) -> token
        self._challenge: dict[str, Challenge] = {}  # host -> last bearer challenge
        self._registry = ""

    # -- hosts and TLS ---------------------------------------------------------------------------------------
    def hosts(self, registry: str) -> list[RegistryHost]:
        hosts = registry_hosts(registry, self.config_dir)
        if self.plain_http:
            hosts = [RegistryHost("http", h.host, h.path, h.capabilities, h.ca_files, h.client_certs,
                                  h.skip_verify, h.headers, h.origin) for h in hosts]
        return hosts

    def _ssl_for(self, host: RegistryHost) -> ssl.SSLContext | bool:
        if host.scheme != "https":
            return False
        if not (host.ca_files or host.client_certs or host.skip_verify):
            return True  # aiohttp's default context: the system CA store
        ctx = self._ssl.get(host)
        if ctx is None:
            ctx = ssl.create_default_context()
            try:
                for ca in host.ca_files:
                    ctx.load_verify_locations(cafile=ca)
                for cert, key in host.client_certs:
                    ctx.load_cert_chain(cert, key or None)
            except (OSError, ssl.SSLError) as e:
                raise RegistryError(f"{host.base_url}: TLS configuration: {e}") from None
            if host.skip_verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._ssl[host] = ctx
        return ctx

    # -- authentication --------------------------------------------------------------------------------------
    def _auth_header(self, host: RegistryHost, scope: str) -> str | None:
        tok = self._bearer.get((host.host, scope))
        if tok is not None and tok.valid():
            return "Bearer " + tok.value
        return self._basic.get(host.host)

    async def _authorize(self, host: RegistryHost, challenges: list[Challenge], scope: str, what: str) -> None:
        creds = self.auth if auth_applies(self.auth, self._registry, host) else None
        bearer = next((c for c in challenges if c.scheme == "bearer"), None)
        basic = next((c for c in challenges if c.scheme == "basic"), None)
        if bearer is not None:
            self._challenge[host.host] = bearer
            token = await self._fetch_token(host, bearer, scope, creds, what)
            self._bearer[(host.host, scope)] = token
            return
        if basic is not None:
            pair = creds.basic() if creds else None
            if pair is None:
                raise Unauthorized(f"{what}: {host.host} requires credentials (Basic) and none were given")
            self._basic[host.host] = basic_header(*pair)
            return
        raise Unauthorized(f"{what}: {host.host} answered 401 without a usable WWW-Authenticate challenge")

    async def _fetch_token(self, host: RegistryHost, ch: Challenge, scope: str, creds: AuthConfig | None,
                           what: str) -> Token:
        if creds is not None and creds.registry_token:
            return Token(creds.registry_token, float("inf"))
        realm = ch.params.get("realm")
        if not realm:
            raise Unauthorized(f"{what}: {host.host}: Bearer challenge without a realm")
        realm_url = URL(realm)
        if realm_url.scheme not in ("http", "https"):
            raise Unauthorized(f"{what}: {host.host}: token realm {realm!r} is not an http(s) URL")
        scopes = [scope]
        if ch.params.get("scope") and ch.params["scope"] != scope:
            scopes.append(ch.params["scope"])
        service = ch.params.get("service", "")
        # The registry's own TLS settings apply when the realm is on the same host; else the system CA store.
        same_host = realm_url.scheme == host.scheme and f"{realm_url.host}:{realm_url.port}" in (
            host.host, f"{host.host}:{realm_url.port}")
        ssl_arg: ssl.SSLContext | bool = self._ssl_for(host) if same_host else realm_url.scheme == "https"
        headers = {"User-Agent": USER_AGENT}
        try:
            if creds is not None and creds.identity_token:
                form = {"grant_type": "refresh_token", "refresh_token": creds.identity_token, "service": service,
                        "scope": " ".join(scopes), "client_id": "husk"}
                resp = await self.session.post(realm_url, data=form, headers=headers, ssl=ssl_arg,
                                               timeout=self.timeout)
            else:
                pair = creds.basic() if creds else None
                if pair is not None:
                    headers["Authorization"] = basic_header(*pair)
                params = [("scope", s) for s in scopes]
                if service:
                    params.insert(0, ("service", service))
                resp = await self.session.get(realm_url, params=params, headers=headers, ssl=ssl_arg,
                                              timeout=self.timeout)
            async with resp:
                body = await resp.read()
                if resp.status == 401:
                    raise Unauthorized(f"{what}: token server {realm_url.host} refused the credentials"
                                       if creds else f"{what}: token server {realm_url.host} requires credentials")
                if resp.status == 403:
                    raise Denied(f"{what}: token server {realm_url.host} denied access to {scope}")
                if resp.status != 200:
                    raise RegistryError(f"{what}: token server {realm_url.host} answered {resp.status}")
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise RegistryError(f"{what}: token server {realm_url.host}: {e or type(e).__name__}") from None
        try:
            obj = json.loads(body)
        except ValueError:
            raise Unauthorized(f"{what}: token server {realm_url.host} answered non-JSON") from None
        return token_from_response(obj)

    # -- requests --------------------------------------------------------------------------------------------
    async def _delay(self, attempt: int, retry_after: str | None = None) -> None:
        d = self.backoff * (2 ** attempt) * (0.75 + random.random() / 2)
        if retry_after and retry_after.isdigit():
            d = max(d, min(float(retry_after), 30.0))
        await asyncio.sleep(min(d, 30.0))

    async def _send(self, host: RegistryHost, method: str, url: str, scope: str, what: str,
                    headers: dict[str, str] | None = None) -> aiohttp.ClientResponse:
        """Send with auth, retries and redirects. The returned response (any status) must be released."""
        attempt = auth_rounds = redirects = 0
        cur = URL(url, encoded=False)
        home = _origin(cur)
        while True:
            same_origin = _origin(cur) == home
            hdrs = {"User-Agent": USER_AGENT}
            if same_origin:
                for k, vals in host.headers.items():
                    hdrs[k] = ", ".join(vals)
            hdrs.update(headers or {})
            sent_auth = None
            if same_origin:
                sent_auth = self._auth_header(host, scope)
                if sent_auth:
                    hdrs["Authorization"] = sent_auth
            try:
                resp = await self.session.request(method, cur, headers=hdrs, allow_redirects=False,
                                                  ssl=self._ssl_for(host) if same_origin else True,
                                                  timeout=self.timeout)
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                if attempt < self.retries:
                    log.info("%s: %s %s: %s; retrying", what, method, cur, e or type(e).__name__)
                    await self._delay(attempt)
                    attempt += 1
                    continue
                raise RegistryError(f"{what}: {host.base_url}: {e or type(e).__name__}") from None
            status = resp.status
            if status in REDIRECT_STATUS:
                loc = resp.headers.get("Location")
                resp.release()
                if not loc or redirects >= MAX_REDIRECTS:
                    raise RegistryError(f"{what}: {host.base_url}: bad or endless redirect")
                cur = cur.join(URL(loc))
                if cur.scheme not in ("http", "https"):
                    raise RegistryError(f"{what}: redirect to unsupported URL {cur}")
                redirects += 1
                continue
            if status == 401 and same_origin and auth_rounds < 2:
                challenges = [c for v in resp.headers.getall("WWW-Authenticate", []) for c in parse_challenges(v)]
                body = await resp.read()
                resp.release()
                code, msg = _error_detail(body)
                if code == "DENIED" and sent_auth is not None:
                    raise Denied(f"{what}: {host.host}: access denied: {msg}")
                # A token cached from an earlier request of this pull may have expired or lost its grant: get a
                # fresh one once. Credentials refused right after a fresh authorization are final.
                if sent_auth is not None and (auth_rounds > 0 or not sent_auth.startswith("Bearer ")):
                    creds = self.auth if auth_applies(self.auth, self._registry, host) else None
                    reason = "credentials were refused" if creds else "authentication required"
                    raise Unauthorized(f"{what}: {host.host}: {reason}" + (f" ({msg})" if msg else ""))
                await self._authorize(host, challenges, scope, what)
                auth_rounds += 1
                continue
            if status in RETRY_STATUS and attempt < self.retries:
                ra = resp.headers.get("Retry-After")
                resp.release()
                log.info("%s: %s %s: HTTP %d; retrying", what, method, cur, status)
                await self._delay(attempt, ra)
                attempt += 1
                continue
            return resp

    async def _raise_for(self, resp: aiohttp.ClientResponse, host: RegistryHost, what: str) -> None:
        body = await resp.read()
        resp.release()
        code, msg = _error_detail(body)
        detail = f" ({code}: {msg})" if code else ""
        if resp.status == 404:
            raise NotFound(f"{what}: not found at {host.base_url}{detail}")
        if resp.status == 401:
            raise Unauthorized(f"{what}: {host.host}: authentication required{detail}")
        if resp.status == 403:
            raise Denied(f"{what}: {host.host}: access denied{detail}")
        raise RegistryError(f"{what}: {host.base_url} answered HTTP {resp.status}{detail}")

    # -- manifests -------------------------------------------------------------------------------------------
    async def _get_manifest(self, host: RegistryHost, path: str, obj: str,
                            what: str) -> tuple[bytes, str, str]:
        url = host.url(f"/{path}/manifests/{obj}")
        resp = await self._send(host, "GET", url, repository_scope(path), what, {"Accept": mf.ACCEPT})
        if resp.status != 200:
            await self._raise_for(resp, host, what)
        try:
            if resp.content_length is not None and resp.content_length > mf.MAX_MANIFEST_BYTES:
                raise InvalidManifest(what, f"larger than {mf.MAX_MANIFEST_BYTES} bytes")
            data = bytearray()
            async for chunk in resp.content.iter_chunked(CHUNK):
                data += chunk
                if len(data) > mf.MAX_MANIFEST_BYTES:
                    raise InvalidManifest(what, f"larger than {mf.MAX_MANIFEST_BYTES} bytes")
        except (TimeoutError, aiohttp.ClientError) as e:
            raise RegistryError(f"{what}: {host.base_url}: {e or type(e).__name__}") from None
        finally:
            resp.release()
        return bytes(data), resp.headers.get("Content-Type", ""), resp.headers.get("Docker-Content-Digest", "")

    def _hosts_for(self, ref: Reference, need_resolve: bool) -> list[RegistryHost]:
        self._registry = ref.domain
        hosts = [h for h in self.hosts(ref.domain) if h.can(CAP_PULL) and (h.can(CAP_RESOLVE) or not need_resolve)]
        if not hosts:
            raise RegistryError(f"{ref}: no configured host for {ref.domain} may "
                                f"{'resolve tags' if need_resolve else 'pull'}")
        return hosts

    async def resolve(self, ref: Reference) -> Resolved:
        """Fetch the manifest or index `ref` names, from the first host that has it; verify its digest."""
        hosts = self._hosts_for(ref, need_resolve=ref.digest is None)
        errors: list[Exception] = []
        what = str(ref)
        for h in hosts:
            try:
                data, ctype, hdr_digest = await self._get_manifest(h, ref.path, ref.object, what)
                media_type = mf.detect_media_type(data, ctype, what)
                digest = mf.sha256_digest(data)
                if ref.digest and digest != ref.digest:
                    raise DigestMismatch(f"{what}: manifest from {h.host}", ref.digest, digest)
                if not ref.digest and hdr_digest.startswith("sha256:") and hdr_digest != digest:
                    raise DigestMismatch(f"{what}: manifest from {h.host} (Docker-Content-Digest)", hdr_digest,
                                         digest)
            except (NotFound, RegistryError, Unauthorized, Denied, ContentError, InvalidManifest) as e:
                log.info("%s: %s: %s", what, h.base_url, e)
                errors.append(e)
                continue
            return Resolved(ref, h, mf.Descriptor(media_type, digest, len(data)), data)
        tried = ", ".join(h.base_url for h in hosts)
        if all(isinstance(e, NotFound) for e in errors):
            raise NotFound(f"{what}: not found (tried {tried})")
        raise _worst(errors, NotFound(f"{what}: not found (tried {tried})"))

    def order_hosts(self, ref: Reference, first: RegistryHost) -> list[RegistryHost]:
        hosts = self._hosts_for(ref, need_resolve=False)
        return [first] + [h for h in hosts if h != first]

    async def fetch_manifest(self, ref: Reference, hosts: list[RegistryHost], desc: mf.Descriptor,
                             what: str) -> bytes:
        """A manifest or config by digest (small: kept in memory), verified against `desc`."""
        errors: list[Exception] = []
        for h in hosts:
            try:
                if desc.media_type in mf.CONFIG_TYPES:
                    data = await self._get_blob_small(h, ref.path, desc, what)
                else:
                    data, _ct, _d = await self._get_manifest(h, ref.path, desc.digest, what)
                digest = mf.sha256_digest(data)
                if digest != desc.digest:
                    raise DigestMismatch(f"{what} from {h.host}", desc.digest, digest)
                if len(data) != desc.size:
                    raise ContentError(f"{what} from {h.host}: size {len(data)}, descriptor says {desc.size}")
                return data
            except (NotFound, RegistryError, Unauthorized, Denied, ContentError, InvalidManifest) as e:
                errors.append(e)
        raise _worst(errors, NotFound(f"{what}: not found"))

    async def _get_blob_small(self, host: RegistryHost, path: str, desc: mf.Descriptor, what: str) -> bytes:
        if desc.size > mf.MAX_CONFIG_BYTES:
            raise InvalidManifest(what, f"config larger than {mf.MAX_CONFIG_BYTES} bytes")
        url = host.url(f"/{path}/blobs/{desc.digest}")
        resp = await self._send(host, "GET", url, repository_scope(path), what)
        if resp.status != 200:
            await self._raise_for(resp, host, what)
        try:
            data = bytearray()
            async for chunk in resp.content.iter_chunked(CHUNK):
                data += chunk
                if len(data) > desc.size:
                    raise ContentError(f"{what}: more data than the descriptor's {desc.size} bytes")
        except (TimeoutError, aiohttp.ClientError) as e:
            raise RegistryError(f"{what}: {host.base_url}: {e or type(e).__name__}") from None
        finally:
            resp.release()
        return bytes(data)

    # -- blobs -----------------------------------------------------------------------------------------------
    async def fetch_blob(self, store: ContentStore, ref: Reference, hosts: list[RegistryHost],
                         desc: mf.Descriptor, what: str, progress: ProgressFn | None = None,
                         sink: Sink | None = None) -> str:
        """Put the blob `desc` into `store` (no-op if present); resumes after transient failures. `sink` sees
        the downloaded chunks (see ContentStore.ingest)."""
        attempt = 0
        while True:
            try:
                return await store.ingest(desc.digest, desc.size, self._blob_fetcher(ref, hosts, desc, what),
                                          what, progress, sink)
            except (TimeoutError, ShortRead, aiohttp.ClientError, RegistryError) as e:
                if attempt >= self.retries:
                    if isinstance(e, (ShortRead, RegistryError)):
                        raise
                    raise RegistryError(f"{what}: download failed: {e or type(e).__name__}") from None
                log.info("%s: %s; resuming", what, e or type(e).__name__)
                await self._delay(attempt)
                attempt += 1

    def _blob_fetcher(self, ref: Reference, hosts: list[RegistryHost], desc: mf.Descriptor, what: str):  # type: ignore[no-untyped-def]
        async def fetch(offset: int) -> tuple[int, AsyncIterator[bytes]]:
            errors: list[Exception] = []
            for h in hosts:
                url = h.url(f"/{ref.path}/blobs/{desc.digest}")
                headers = {"Range": f"bytes={offset}-"} if offset else {}
                resp = await self._send(h, "GET", url, repository_scope(ref.path), what, headers)
                if resp.status == 416 and offset:
                    resp.release()
                    resp = await self._send(h, "GET", url, repository_scope(ref.path), what)
                if resp.status == 404:
                    try:
                        await self._raise_for(resp, h, what)
                    except NotFound as e:
                        errors.append(e)
                        continue
                if resp.status not in (200, 206):
                    try:
                        await self._raise_for(resp, h, what)
                    except ImageError as e:
                        errors.append(e)
                        continue
                start = 0
                if resp.status == 206:
                    start = _content_range_start(resp.headers.get("Content-Range", ""))
                    if start is None:
                        resp.release()
                        errors.append(RegistryError(f"{what}: {h.host}: 206 without a usable Content-Range"))
                        continue
                return start, _iterate(resp)
            raise _worst(errors, NotFound(f"{what}: not found"))
        return fetch


def _content_range_start(v: str) -> int | None:
    # "bytes 100-199/200"
    try:
        unit, rng = v.split(" ", 1)
        if unit != "bytes":
            return None
        return int(rng.split("-", 1)[0])
    except ValueError:
        return None


async def _iterate(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in resp.content.iter_chunked(CHUNK):
            yield chunk
    finally:
        resp.release()


def new_session(limit_per_host: int = 8) -> aiohttp.ClientSession:
    """The session the image service keeps for its lifetime (keep-alive; proxies from the environment)."""
    conn = aiohttp.TCPConnector(limit=64, limit_per_host=limit_per_host, enable_cleanup_closed=True)
    return aiohttp.ClientSession(connector=conn, trust_env=True, auto_decompress=False,
                                 skip_auto_headers=("Accept-Encoding",))

