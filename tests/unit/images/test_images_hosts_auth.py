"""hosts.toml parsing (containerd layout) and credentials / WWW-Authenticate parsing."""
from __future__ import annotations

import base64
import os

import pytest

from cri_server.images.auth import AuthConfig, parse_challenges, token_from_response
from cri_server.images.errors import ConfigError, Unauthorized
from cri_server.images.hostsconfig import RegistryHost, parse_hosts_toml, registry_hosts
from cri_server.images.registry import auth_applies


def _write(d, host: str, text: str) -> None:  # type: ignore[no-untyped-def]
    p = d / host
    p.mkdir(parents=True, exist_ok=True)
    (p / "hosts.toml").write_text(text)


def test_default_without_config():
    (h,) = registry_hosts("docker.io", None)
    assert h.base_url == "https://registry-1.docker.io/v2"
    (h,) = registry_hosts("registry.k8s.io", None)
    assert h.base_url == "https://registry.k8s.io/v2" and h.can("resolve")


def test_mirrors_then_server(tmp_path):
    _write(tmp_path, "docker.io", '''
server = "https://registry-1.docker.io"
[host."http://127.0.0.1:5000"]
  capabilities = ["pull", "resolve"]
[host."https://mirror.test/base"]
  capabilities = ["pull"]
  skip_verify = true
  ca = "ca.pem"
  client = [["c.pem", "k.pem"]]
  [host."https://mirror.test/base".header]
    x-custom = "1"
''')
    hs = registry_hosts("docker.io", str(tmp_path))
    assert [h.base_url for h in hs] == ["http://127.0.0.1:5000/v2", "https://mirror.test/base/v2",
                                        "https://registry-1.docker.io/v2"]
    assert hs[1].capabilities == frozenset({"pull"}) and hs[1].skip_verify
    assert hs[1].ca_files == (str(tmp_path / "docker.io" / "ca.pem"),)
    assert hs[1].client_certs == ((str(tmp_path / "docker.io" / "c.pem"), str(tmp_path / "docker.io" / "k.pem")),)
    assert hs[1].headers == {"x-custom": ("1",)}
    assert hs[2].origin == "hosts.toml server"


def test_server_replaces_upstream_and_is_not_duplicated(tmp_path):
    # The anchor's layout: the local registry is both server and the only host; no upstream fallback.
    _write(tmp_path, "registry.k8s.io", 'server = "http://127.0.0.1:5000"\n[host."http://127.0.0.1:5000"]\n'
                                        '  capabilities = ["pull", "resolve"]\n')
    hs = registry_hosts("registry.k8s.io", str(tmp_path))
    assert [h.base_url for h in hs] == ["http://127.0.0.1:5000/v2"]
    _write(tmp_path, "gcr.io", 'server = "http://127.0.0.1:5001"\n')
    assert [h.base_url for h in registry_hosts("gcr.io", str(tmp_path))] == ["http://127.0.0.1:5001/v2"]


def test_port_directory_default_and_override_path(tmp_path):
    _write(tmp_path, "127.0.0.1:5000", '[host."http://127.0.0.1:5000"]\n')
    assert registry_hosts("127.0.0.1:5000", str(tmp_path))[0].scheme == "http"
    _write(tmp_path, "_default", '[host."https://proxy.test/v2/prefix"]\n  override_path = true\n')
    hs = registry_hosts("quay.io", str(tmp_path))
    assert [h.base_url for h in hs] == ["https://proxy.test/v2/prefix", "https://quay.io/v2"]


@pytest.mark.parametrize("text,msg", [
    ("server = 5", "expected a URL"),
    ('server = "ftp://x"', "unsupported scheme"),
    ('[host."https://m"]\n  capabilities = ["fly"]', "unknown capability"),
    ('[host."https://m"]\n  skip_verify = "yes"', "boolean"),
    ("this is = not toml =", "not valid TOML"),
    ('host = "x"', "table of tables"),
])
def test_bad_hosts_toml(text, msg):
    with pytest.raises(ConfigError, match=msg):
        parse_hosts_toml(text, "example.test", "/etc/husk/certs.d/example.test/hosts.toml")


def test_challenges():
    (c,) = parse_challenges('Bearer realm="https://auth.test/token",service="registry.test",'
                            'scope="repository:a/b:pull,push"')
    assert c.scheme == "bearer" and c.params == {"realm": "https://auth.test/token", "service": "registry.test",
                                                 "scope": "repository:a/b:pull,push"}
    cs = parse_challenges('Basic realm="x y", Bearer realm="r", error="insufficient_scope"')
    assert [c.scheme for c in cs] == ["basic", "bearer"] and cs[1].params["error"] == "insufficient_scope"
    assert parse_challenges('Bearer realm="a\\"b"')[0].params["realm"] == 'a"b'
    assert parse_challenges("") == []


def test_auth_config():
    assert AuthConfig(username="u", password="p").basic() == ("u", "p")
    assert AuthConfig(auth=base64.b64encode(b"u:p:q").decode()).basic() == ("u", "p:q")
    assert AuthConfig().basic() is None and AuthConfig().is_empty()
    with pytest.raises(Unauthorized):
        AuthConfig(auth="!!!").basic()
    with pytest.raises(Unauthorized):
        AuthConfig(auth=base64.b64encode(b"nocolon").decode()).basic()
    assert "p" not in repr(AuthConfig(username="u", password="p"))


def test_auth_applies_to_matching_server_only():
    h = RegistryHost("https", "mirror.test")
    a = AuthConfig(username="u", password="p")
    assert auth_applies(a, "docker.io", h)
    assert auth_applies(AuthConfig(username="u", server_address="https://index.docker.io/v1/"), "docker.io", h)
    assert auth_applies(AuthConfig(username="u", server_address="mirror.test"), "x.test", h)
    assert not auth_applies(AuthConfig(username="u", server_address="other.test"), "x.test", h)
    assert not auth_applies(None, "x", h) and not auth_applies(AuthConfig(), "x", h)


def test_token_response():
    t = token_from_response({"access_token": "abc", "expires_in": 300}, now=0.0)
    assert t.value == "abc" and t.expires_at == 295.0
    assert token_from_response({"token": "t"}, now=0.0).expires_at == 55.0
    with pytest.raises(Unauthorized):
        token_from_response({"nothing": 1})
    assert os.environ.get("HTTPS_PROXY") is None
