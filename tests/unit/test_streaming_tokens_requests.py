"""Token cache (single use, TTL, in-flight limit) and the validation of cached requests."""
from __future__ import annotations

import base64

import pytest

from cri_server.streaming import AttachRequest, ExecRequest, InvalidStreamRequest, PortForwardRequest, TooManyRequests
from cri_server.streaming.tokens import RequestCache, new_token


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_token_is_8_random_bytes_url_safe():
    tokens = {new_token() for _ in range(200)}
    assert len(tokens) == 200
    for t in tokens:
        assert len(t) == 11 and all(c.isalnum() or c in "-_" for c in t)
        assert len(base64.urlsafe_b64decode(t + "=")) == 8


def test_consume_once():
    cache: RequestCache[str] = RequestCache()
    tok = cache.insert("req")
    assert cache.consume(tok) == "req"
    assert cache.consume(tok) is None
    assert cache.consume("unknown") is None


def test_expiry_after_ttl():
    clock = Clock()
    cache: RequestCache[str] = RequestCache(ttl=60, clock=clock)
    early, late = cache.insert("a"), cache.insert("b")
    clock.now += 59.9
    assert cache.consume(early) == "a"
    clock.now += 0.1
    assert cache.consume(late) is None


def test_in_flight_limit_counts_only_live_tokens():
    clock = Clock()
    cache: RequestCache[int] = RequestCache(ttl=60, max_in_flight=3, clock=clock)
    toks = [cache.insert(i) for i in range(3)]
    with pytest.raises(TooManyRequests):
        cache.insert(3)
    cache.consume(toks[0])
    cache.insert(4)
    clock.now += 61  # all expired: room again
    assert len(cache) == 0
    for i in range(3):
        cache.insert(i)


def test_exec_request_validation():
    ExecRequest("c", ("ls",), stdout=True)
    with pytest.raises(InvalidStreamRequest) as e:
        ExecRequest("", ("ls",), stdout=True)
    assert e.value.field == "container_id"
    with pytest.raises(InvalidStreamRequest, match="tty and stderr"):
        ExecRequest("c", ("ls",), tty=True, stdout=True, stderr=True)
    with pytest.raises(InvalidStreamRequest, match="one of stdin"):
        ExecRequest("c", ("ls",))
    with pytest.raises(InvalidStreamRequest) as e:
        ExecRequest("c", (), stdout=True)
    assert e.value.field == "cmd"


def test_requests_from_cri_like_messages():
    class Msg:
        container_id = "abc"
        cmd = ["sh", "-c", "true"]
        tty, stdin, stdout, stderr = False, True, True, False

    assert ExecRequest.of(Msg()) == ExecRequest("abc", ("sh", "-c", "true"), False, True, True, False)
    assert AttachRequest.of(Msg()) == AttachRequest("abc", False, True, True, False)

    class Pf:
        pod_sandbox_id = "sb"
        port = [80, 8080]

    assert PortForwardRequest.of(Pf()) == PortForwardRequest("sb", (80, 8080))
    with pytest.raises(InvalidStreamRequest):
        PortForwardRequest("sb", (0,))
    with pytest.raises(InvalidStreamRequest):
        PortForwardRequest("", ())


def test_package_imports_nothing_heavy():
    import subprocess
    import sys
    code = ("import sys, cri_server.streaming, cri_server.streaming.netns; "
            "print(sorted(m for m in ('grpc', 'google.protobuf', 'websockets', 'pyroute2', 'click') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
