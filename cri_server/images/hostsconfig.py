"""Registry host configuration in containerd's `hosts.toml` directory layout (`<dir>/<host[:port]>/hosts.toml`).

Turns a registry name into the ordered list of endpoints to try: the `[host."..."]` mirrors in file order,
then `server` (the upstream, `https://<host>` unless the file sets another one). Reads files only.
"""
from __future__ import annotations

import logging
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .errors import ConfigError

log = logging.getLogger(__name__)

CAP_PULL = "pull"
CAP_RESOLVE = "resolve"
CAP_PUSH = "push"
ALL_CAPS = frozenset({CAP_PULL, CAP_RESOLVE, CAP_PUSH})
DEFAULT_DIR_NAME = "_default"


@dataclass(frozen=True)
class RegistryHost:
    """One endpoint that serves the distribution API for a registry."""

    scheme: str  # "https" or "http"
    host: str  # host[:port]
    path: str = "/v2"
    capabilities: frozenset[str] = ALL_CAPS
    ca_files: tuple[str, ...] = ()
    client_certs: tuple[tuple[str, str], ...] = ()  # (cert, key)
    skip_verify: bool = False
    headers: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False, compare=False)
    # Where the entry came from, for messages: "hosts.toml mirror", "hosts.toml server", "default".
    origin: str = "default"

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}{self.path}"

    def url(self, suffix: str) -> str:
        return self.base_url + suffix

    def can(self, cap: str) -> bool:
        return cap in self.capabilities


def default_server(registry: str) -> str:
    if registry == "docker.io":
        return "https://registry-1.docker.io"
    return f"https://{registry}"


def host_dir_name(registry: str) -> str:
    return registry


def _as_list(v: Any, what: str, path: str) -> list[Any]:
    if v is None:
        return []
    if isinstance(v, (str, bool, int)):
        return [v]
    if isinstance(v, list):
        return v
    raise ConfigError(path, f"{what}: expected a string or a list")


def _parse_url(raw: Any, path: str, what: str, override_path: bool) -> tuple[str, str, str]:
    if not isinstance(raw, str) or not raw:
        raise ConfigError(path, f"{what}: expected a URL string")
    u = raw if "://" in raw else "https://" + raw
    parts = urlsplit(u)
    if parts.scheme not in ("http", "https"):
        raise ConfigError(path, f"{what}: unsupported scheme {parts.scheme!r} in {raw!r}")
    if not parts.netloc:
        raise ConfigError(path, f"{what}: no host in {raw!r}")
    p = parts.path.rstrip("/")
    if not override_path:
        if not p.endswith("/v2"):
            p = p + "/v2"
    elif not p:
        raise ConfigError(path, f"{what}: override_path needs a path in {raw!r}")
    return parts.scheme, parts.netloc, p


def _entry(tbl: dict[str, Any], url: Any, path: str, what: str, base_dir: str, origin: str) -> RegistryHost:
    override = tbl.get("override_path", False)
    if not isinstance(override, bool):
        raise ConfigError(path, f"{what}.override_path: expected a boolean")
    scheme, host, p = _parse_url(url, path, what, override)
    caps_raw = tbl.get("capabilities")
    if caps_raw is None:
        caps = ALL_CAPS
    else:
        caps_l = _as_list(caps_raw, f"{what}.capabilities", path)
        bad = [c for c in caps_l if c not in ALL_CAPS]
        if bad:
            raise ConfigError(path, f"{what}.capabilities: unknown capability {bad[0]!r}")
        caps = frozenset(caps_l)

    def rel(f: Any) -> str:
        if not isinstance(f, str):
            raise ConfigError(path, f"{what}: file names must be strings")
        return f if os.path.isabs(f) else os.path.join(base_dir, f)

    cas = tuple(rel(f) for f in _as_list(tbl.get("ca"), f"{what}.ca", path))
    certs: list[tuple[str, str]] = []
    for c in _as_list(tbl.get("client"), f"{what}.client", path):
        if isinstance(c, str):
            certs.append((rel(c), ""))
        elif isinstance(c, list) and len(c) == 2:
            certs.append((rel(c[0]), rel(c[1])))
        else:
            raise ConfigError(path, f"{what}.client: expected a file or a [cert, key] pair")
    skip = tbl.get("skip_verify", False)
    if not isinstance(skip, bool):
        raise ConfigError(path, f"{what}.skip_verify: expected a boolean")
    headers: dict[str, tuple[str, ...]] = {}
    hdr = tbl.get("header") or {}
    if not isinstance(hdr, dict):
        raise ConfigError(path, f"{what}.header: expected a table")
    for k, v in hdr.items():
        vals = _as_list(v, f"{what}.header.{k}", path)
        if not all(isinstance(x, str) for x in vals):
            raise ConfigError(path, f"{what}.header.{k}: values must be strings")
        headers[str(k)] = tuple(vals)
    return RegistryHost(scheme, host, p, caps, cas, tuple(certs), skip, headers, origin)


def parse_hosts_toml(data: bytes | str, registry: str, path: str) -> list[RegistryHost]:
    """Endpoints for `registry` described by one hosts.toml's content (`path` is used for messages/paths)."""
    text = data.decode() if isinstance(data, bytes) else data
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, f"not valid TOML: {e}") from None
    base_dir = os.path.dirname(path)
    out: list[RegistryHost] = []
    hosts = doc.get("host") or {}
    if not isinstance(hosts, dict):
        raise ConfigError(path, "[host] must be a table of tables keyed by URL")
    for url, tbl in hosts.items():
        if not isinstance(tbl, dict):
            raise ConfigError(path, f"host.{url!r} must be a table")
        out.append(_entry(tbl, url, path, f"host.{url!r}", base_dir, "hosts.toml mirror"))
    server = doc.get("server", default_server(registry))
    upstream = _entry(doc, server, path, "server", base_dir, "hosts.toml server")
    # containerd lists `server` last; if a mirror is the same endpoint, keep the mirror's settings only.
    if not any((h.scheme, h.host, h.path) == (upstream.scheme, upstream.host, upstream.path) for h in out):
        out.append(upstream)
    return out


def registry_hosts(registry: str, config_dir: str | None) -> list[RegistryHost]:
    """Endpoints for `registry` (`host[:port]` as in the reference), in the order to try them."""
    if config_dir:
        for name in (host_dir_name(registry), DEFAULT_DIR_NAME):
            path = os.path.join(config_dir, name, "hosts.toml")
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                continue
            except OSError as e:
                raise ConfigError(path, e.strerror or str(e)) from None
            # _default/hosts.toml applies to every registry without its own directory; without a `server`
            # key its upstream is this registry's default, as in containerd.
            return parse_hosts_toml(data, registry, path)
    scheme, host, p = _parse_url(default_server(registry), "<default>", "server", False)
    return [RegistryHost(scheme, host, p, ALL_CAPS, origin="default")]
