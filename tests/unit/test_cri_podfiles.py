"""The pod's resolv.conf, hosts and hostname files."""
from __future__ import annotations

import os

import pytest

from cri_server import podfiles
from cri_server.api.v1 import api_pb2 as pb
from cri_server.errors import InvalidArgument


def test_resolv_conf_from_dns_config():
    dns = pb.DNSConfig(servers=["10.10.10.10"], searches=["google.com"], options=["ndots:8"])
    text = podfiles.resolv_conf(dns)
    assert text == "search google.com\nnameserver 10.10.10.10\noptions ndots:8\n"


def test_resolv_conf_falls_back_to_the_node(tmp_path):
    node = tmp_path / "resolv.conf"
    node.write_text("nameserver 1.2.3.4\n")
    assert podfiles.resolv_conf(None, str(node)) == "nameserver 1.2.3.4\n"
    assert podfiles.resolv_conf(pb.DNSConfig(), str(node)) == "nameserver 1.2.3.4\n"
    assert podfiles.resolv_conf(None, str(tmp_path / "none")) == ""


def test_bad_server():
    with pytest.raises(InvalidArgument, match=r"servers\[1\]"):
        podfiles.resolv_conf(pb.DNSConfig(servers=["1.1.1.1", "a b"]))


def test_hosts_and_hostname(tmp_path):
    text = podfiles.hosts("web-0", ["10.88.0.5"])
    assert "127.0.0.1\tlocalhost" in text and "10.88.0.5\tweb-0" in text
    assert podfiles.hostname_file("web-0") == "web-0\n"
    p = tmp_path / "hosts"
    podfiles.write_atomic(str(p), text)
    assert p.read_text() == text and oct(os.stat(p).st_mode & 0o777) == "0o644"
    assert os.listdir(tmp_path) == ["hosts"]
