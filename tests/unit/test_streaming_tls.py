"""The streaming server's TLS files: the context husk-cri builds from its config (certificate, key, an optional CA
for client certificates), errors that name the file and the config key, and mutual TLS end to end."""
from __future__ import annotations

import ssl

import pytest

from cri_server.config import ConfigError, StreamingConfig
from cri_server.rpc.streaming import tls_context
from cri_server.streaming import ExecRequest
from cri_server.streaming.tls import TlsFileError, TlsFiles, server_context
from tests.streaming_support.harness import run, serving
from tests.streaming_support.spdy_client import spdy_exec
from tests.support.tlscerts import CertFiles, client_context, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_certs(str(tmp_path_factory.mktemp("stream-tls")))


def test_no_tls_files_is_plain_http():
    assert tls_context(StreamingConfig()) is None


def test_context_from_the_config(certs):
    ctx = tls_context(StreamingConfig(tls_cert_file=certs.server_cert, tls_key_file=certs.server_key))
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_NONE
    mtls = tls_context(StreamingConfig(tls_cert_file=certs.server_cert, tls_key_file=certs.server_key,
                                       tls_ca_file=certs.ca))
    assert mtls is not None and mtls.verify_mode == ssl.CERT_REQUIRED


def _bad(tmp_path, name: str, data: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def test_bad_files_are_named(tmp_path, certs):
    pem = open(certs.server_cert, "rb").read()
    truncated = _bad(tmp_path, "truncated.pem", pem[: len(pem) // 2])
    garbled = _bad(tmp_path, "garbled.pem", pem.replace(pem.splitlines()[3], b"!!!!" * 16))
    cases = [
        (TlsFiles(str(tmp_path / "missing.pem"), certs.server_key), "cert", "missing.pem", "cannot read"),
        (TlsFiles(_bad(tmp_path, "empty.pem", b""), certs.server_key), "cert", "empty.pem", "no PEM certificate"),
        (TlsFiles(truncated, certs.server_key), "cert", "truncated.pem", "no END line"),
        (TlsFiles(garbled, certs.server_key), "cert", "garbled.pem", "does not parse"),
        (TlsFiles(certs.server_cert, str(tmp_path / "none.key")), "key", "none.key", "cannot read"),
        (TlsFiles(certs.server_cert, certs.server_cert), "key", "server.pem", "no PEM private key"),
        (TlsFiles(certs.server_cert, certs.client_key), "key", "client.key", "does not match the certificate"),
        (TlsFiles(certs.server_cert, certs.server_key, certs.server_key), "ca", "server.key", "no PEM certificate"),
    ]
    for files, which, name, reason in cases:
        with pytest.raises(TlsFileError) as e:
            server_context(files)
        assert (e.value.which, name in str(e.value), reason in str(e.value)) == (which, True, True), str(e.value)


def test_config_error_names_the_key_and_the_file(tmp_path, certs):
    with pytest.raises(ConfigError) as e:
        tls_context(StreamingConfig(tls_cert_file=certs.server_cert, tls_key_file=str(tmp_path / "gone.key")))
    assert e.value.key == "streaming.tls_key_file" and "gone.key" in str(e.value)
    with pytest.raises(ConfigError) as e:
        tls_context(StreamingConfig(tls_cert_file=certs.server_cert, tls_key_file=certs.server_key,
                                    tls_ca_file=str(tmp_path / "gone-ca.pem")))
    assert e.value.key == "streaming.tls_ca_file" and "gone-ca.pem" in str(e.value)


def test_client_certificates_required_with_a_ca(certs):
    ctx = server_context(TlsFiles(certs.server_cert, certs.server_key, certs.ca))

    async def main():
        async with serving(tls=ctx) as (srv, be):
            url = srv.get_exec_url(ExecRequest("c1", ("echo", "mutual"), stdout=True))
            assert url.startswith("https://127.0.0.1:")
            assert (await spdy_exec(url, ssl=client_context(certs, with_client_cert=True))).stdout == b"mutual\n"
            # Without a client certificate the handshake fails and nothing runs (TLS 1.3 reports the refusal
            # on the first read, so the client sees it as a closed connection or an SSL error).
            url = srv.get_exec_url(ExecRequest("c1", ("echo", "never"), stdout=True))
            with pytest.raises((ssl.SSLError, ConnectionError, EOFError, OSError)):
                await spdy_exec(url, ssl=client_context(certs))
            assert len(be.procs) == 1
    run(main)
