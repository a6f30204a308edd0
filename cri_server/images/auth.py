"""Registry credentials (the CRI AuthConfig fields) and WWW-Authenticate challenge parsing.

No I/O here: the registry client asks this module what to send and fetches tokens itself.
"""
from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass

from .errors import Unauthorized


@dataclass(frozen=True)
class AuthConfig:
    """Credentials for one pull, as in CRI's AuthConfig message."""

    username: str = ""
    password: str = ""
    auth: str = ""  # base64("username:password")
    server_address: str = ""
    identity_token: str = ""  # OAuth2 refresh token, exchanged at the token realm
    registry_token: str = ""  # a bearer token used as is

    def basic(self) -> tuple[str, str] | None:
        """(username, password) from the explicit fields or from `auth`; None when there are none."""
        if self.username or self.password:
            return self.username, self.password
        if self.auth:
            try:
                raw = base64.b64decode(self.auth, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                raise Unauthorized("auth: credentials are not valid base64 of 'username:password'") from None
            user, sep, pw = raw.partition(":")
            if not sep:
                raise Unauthorized("auth: decoded credentials have no ':' between username and password")
            return user, pw
        return None

    def is_empty(self) -> bool:
        return not (self.basic() or self.identity_token or self.registry_token)

    def __repr__(self) -> str:  # never print secrets in logs
        return f"AuthConfig(username={self.username!r}, server_address={self.server_address!r}, ...)"


def basic_header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@dataclass(frozen=True)
class Challenge:
    scheme: str  # lower-case: "bearer" or "basic"
    params: dict[str, str]


def _skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t":
        i += 1
    return i


def _token(s: str, i: int) -> tuple[str, int]:
    j = i
    while j < len(s) and s[j] not in " \t,=\"":
        j += 1
    return s[i:j], j


def _quoted(s: str, i: int) -> tuple[str, int]:
    """s[i] is the opening quote; returns (value, index after the closing quote)."""
    out = []
    i += 1
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            out.append(s[i + 1])
            i += 2
            continue
        if c == '"':
            return "".join(out), i + 1
        out.append(c)
        i += 1
    return "".join(out), i


def parse_challenges(header: str) -> list[Challenge]:
    """Parse one WWW-Authenticate value (RFC 7235): `Bearer realm="...",service="...",scope="..."`."""
    out: list[Challenge] = []
    i = 0
    n = len(header)
    while i < n:
        i = _skip_ws(header, i)
        while i < n and header[i] == ",":
            i = _skip_ws(header, i + 1)
        scheme, i = _token(header, i)
        if not scheme:
            break
        params: dict[str, str] = {}
        while True:
            i = _skip_ws(header, i)
            start = i
            key, j = _token(header, i)
            j = _skip_ws(header, j)
            if not key or j >= n or header[j] != "=":
                i = start  # the next challenge's scheme
                break
            j = _skip_ws(header, j + 1)
            if j < n and header[j] == '"':
                val, j = _quoted(header, j)
            else:
                val, j = _token(header, j)
            params[key.lower()] = val
            j = _skip_ws(header, j)
            if j < n and header[j] == ",":
                j += 1
            i = j
        out.append(Challenge(scheme.lower(), params))
    return out


@dataclass
class Token:
    value: str
    expires_at: float  # time.monotonic()

    def valid(self) -> bool:
        return time.monotonic() < self.expires_at


def token_from_response(obj: object, now: float | None = None) -> Token:
    """A token from a token server's JSON answer (`token` or `access_token`, `expires_in` seconds)."""
    if not isinstance(obj, dict):
        raise Unauthorized("token server: answer is not a JSON object")
    value = obj.get("token") or obj.get("access_token")
    if not isinstance(value, str) or not value:
        raise Unauthorized("token server: answer has no token")
    expires_in = obj.get("expires_in")
    if not isinstance(expires_in, (int, float)) or expires_in <= 0:
        expires_in = 60  # the distribution spec's default
    now = time.monotonic() if now is None else now
    # Renew a little early so a token does not expire between check and use.
    return Token(value, now + max(1.0, float(expires_in) - 5.0))


def repository_scope(repo_path: str, actions: str = "pull") -> str:
    return f"repository:{repo_path}:{actions}"
