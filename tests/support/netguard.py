"""A guard that fails any name or address lookup other than loopback: image tests must never reach a registry
outside this machine, not even with a DNS query. Wraps socket.getaddrinfo (used by aiohttp's default resolver)."""
from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

LOCAL = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}


class ExternalLookup(AssertionError):
    pass


class NetGuard:
    def __init__(self) -> None:
        self.lookups: list[str] = []
        self.refused: list[str] = []
        self._orig: Callable[..., Any] | None = None

    def install(self, monkeypatch: Any) -> None:
        orig = socket.getaddrinfo

        def guarded(host: Any, *args: Any, **kw: Any) -> Any:
            h = host.decode() if isinstance(host, bytes) else str(host)
            self.lookups.append(h)
            if h not in LOCAL:
                self.refused.append(h)
                raise ExternalLookup(f"test tried to resolve {h!r}: only loopback is allowed")
            return orig(host, *args, **kw)
        monkeypatch.setattr(socket, "getaddrinfo", guarded)
        for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
            monkeypatch.delenv(var, raising=False)
