"""Single-use, expiring tokens for streaming URLs (the request cache of kubelet's CRI streaming server).

Owns token generation and the bounded, time-limited map token -> cached request. Must not do I/O.
"""
from __future__ import annotations

import base64
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

TOKEN_BYTES = 8
DEFAULT_TTL = 60.0
DEFAULT_MAX_IN_FLIGHT = 1000


class TooManyRequests(RuntimeError):
    """More unconsumed, unexpired tokens than allowed (gRPC RESOURCE_EXHAUSTED)."""


def new_token() -> str:
    # 8 random bytes, URL-safe base64 without padding: 11 characters that fit in a URL path.
    return base64.urlsafe_b64encode(secrets.token_bytes(TOKEN_BYTES)).rstrip(b"=").decode("ascii")


class RequestCache(Generic[T]):
    """token -> request. A token can be consumed once, and only within `ttl` seconds of its issue."""

    def __init__(self, ttl: float = DEFAULT_TTL, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._max = max_in_flight
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, T]] = OrderedDict()  # issue order == expiry order

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def insert(self, request: T) -> str:
        self._expire()
        if len(self._entries) >= self._max:
            raise TooManyRequests(f"maximum number of in-flight streaming requests ({self._max}) exceeded")
        for _ in range(10):
            token = new_token()
            if token not in self._entries:
                self._entries[token] = (self._clock() + self._ttl, request)
                return token
        raise RuntimeError("could not generate a unique streaming token")

    def consume(self, token: str) -> T | None:
        """The request for token, removing it; None if unknown, already used, or expired."""
        entry = self._entries.pop(token, None)
        if entry is None:
            return None
        expires, request = entry
        if self._clock() >= expires:
            return None
        return request

    def _expire(self) -> None:
        now = self._clock()
        while self._entries:
            token, (expires, _) = next(iter(self._entries.items()))
            if expires > now:
                break
            del self._entries[token]
