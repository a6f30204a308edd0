"""The HTTP/1.1 part of the streaming server: reading one request head, writing plain responses.

Owns request-line and header parsing with size limits, and error bodies shaped like Go's net/http
(http.Error, http.NotFound). Must not know about tokens, SPDY or WebSocket.
"""
from __future__ import annotations

import asyncio
import http
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024
MAX_HEADERS = 100


class HttpError(Exception):
    """A request that gets a plain HTTP error response (and then the connection is closed)."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.headers = headers


@dataclass(frozen=True)
class HttpRequest:
    method: str
    target: str
    path: str
    query: str
    version: str
    headers: tuple[tuple[str, str], ...]  # names lower-cased, in arrival order

    def header(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k == name:
                return v
        return None

    def header_values(self, name: str) -> list[str]:
        name = name.lower()
        return [v for k, v in self.headers if k == name]

    def header_tokens(self, name: str) -> list[str]:
        """All comma-separated, stripped, non-empty values of every occurrence of a header."""
        return [t.strip() for v in self.header_values(name) for t in v.split(",") if t.strip()]


async def read_request(reader: asyncio.StreamReader, max_head: int = MAX_HEAD) -> HttpRequest | None:
    """One request head; None if the client closed before sending anything."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise HttpError(400, "incomplete request head") from exc
    except asyncio.LimitOverrunError as exc:
        raise HttpError(431, "request head too large") from exc
    if len(head) > max_head:
        raise HttpError(431, "request head too large")
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError as exc:  # latin-1 decodes every byte; kept for clarity of intent
        raise HttpError(400, "undecodable request head") from exc
    lines = text[:-4].split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, f"malformed request line {lines[0][:100]!r}")
    method, target, version = parts
    if len(lines) - 1 > MAX_HEADERS:
        raise HttpError(431, "too many request headers")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or any(c in name for c in " \t"):
            raise HttpError(400, f"malformed header line {line[:100]!r}")
        headers.append((name.lower(), value.strip()))
    split = urlsplit(target)
    # Origin form ("/exec/x") as clients send it; absolute form ("http://host/exec/x") is accepted too,
    # as Go's server does for requests that went through a forward proxy.
    if not target.startswith("/") and not (split.scheme in ("http", "https") and split.path.startswith("/")):
        raise HttpError(400, f"request target must be a path, got {target[:100]!r}")
    return HttpRequest(method, target, split.path, split.query, version, tuple(headers))


def response(status: int, headers: tuple[tuple[str, str], ...] = (), body: bytes = b"") -> bytes:
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{k}: {v}" for k, v in headers]
    if status != 101:
        lines.append(f"Content-Length: {len(body)}")
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def error_response(err: HttpError) -> bytes:
    """Like Go's http.Error: a text/plain body with the message and a newline."""
    headers = (("Content-Type", "text/plain; charset=utf-8"), ("X-Content-Type-Options", "nosniff"))
    return response(err.status, headers + err.headers, (err.message + "\n").encode("utf-8"))


def not_found() -> HttpError:
    # Go's http.NotFound body, which is what kubelet's CRI streaming server answers for a bad token.
    return HttpError(404, "404 page not found")
