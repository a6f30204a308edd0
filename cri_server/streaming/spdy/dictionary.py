"""The SPDY/3 header-compression dictionary (SPDY draft 3, section 2.6.10.1), byte-exact.

Owns only the constant; the framing code that uses it lives in frames.py.
"""
from __future__ import annotations

import struct

# The dictionary is, by the specification, a run of length-prefixed words (u32 big-endian length, then
# the ASCII word) followed by one unprefixed run of status codes, reason phrases, dates and common
# header values. It is rebuilt here from those two parts, which keeps it readable and reviewable;
# tests pin the result by its length (1423 bytes) and Adler-32 (0xe3c6a7c2), the value every peer's
# zlib stream carries in its FDICT header, so a one-byte slip fails loudly.
_PREFIXED_WORDS = (
    "options", "head", "post", "put", "delete", "trace", "accept", "accept-charset",
    "accept-encoding", "accept-language", "accept-ranges", "age", "allow", "authorization",
    "cache-control", "connection", "content-base", "content-encoding", "content-language",
    "content-length", "content-location", "content-md5", "content-range", "content-type", "date",
    "etag", "expect", "expires", "from", "host", "if-match", "if-modified-since", "if-none-match",
    "if-range", "if-unmodified-since", "last-modified", "location", "max-forwards", "pragma",
    "proxy-authenticate", "proxy-authorization", "range", "referer", "retry-after", "server", "te",
    "trailer", "transfer-encoding", "upgrade", "user-agent", "vary", "via", "warning",
    "www-authenticate", "method", "get", "status", "200 OK", "version", "HTTP/1.1", "url", "public",
    "set-cookie", "keep-alive", "origin",
)

_TAIL = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    "203 Non-Authoritative Information"
    "204 No Content"
    "301 Moved Permanently"
    "400 Bad Request"
    "401 Unauthorized"
    "403 Forbidden"
    "404 Not Found"
    "500 Internal Server Error"
    "501 Not Implemented"
    "503 Service Unavailable"
    "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 "
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT"
    "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,"
    "text/plain,text/javascript,public"
    "private"
    "max-age="
    "gzip,deflate,sdch"
    "charset=utf-8"
    "charset=iso-8859-1,utf-,*,enq=0."
)


def _build() -> bytes:
    parts = [struct.pack(">I", len(w)) + w.encode("ascii") for w in _PREFIXED_WORDS]
    parts.append(_TAIL.encode("ascii"))
    return b"".join(parts)


SPDY3_DICTIONARY: bytes = _build()
