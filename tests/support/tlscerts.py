"""Test certificates (the `cryptography` test extra): a CA, a server certificate for 127.0.0.1 and a client
certificate, both signed by the CA, written as PEM files. Nothing here is trusted outside the test."""
from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CertFiles:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def _name(cn: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return path


def make_certs(directory: str) -> CertFiles:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID
    os.makedirs(directory, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("husk test streaming CA")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))

    def leaf(cn: str, usage: Any, san: bool) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        b = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca.subject).public_key(key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
             .not_valid_after(now + datetime.timedelta(days=30))
             .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                critical=False)
        cert = b.sign(ca_key, hashes.SHA256())
        return (cert.public_bytes(serialization.Encoding.PEM),
                key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))

    server_cert, server_key = leaf("127.0.0.1", ExtendedKeyUsageOID.SERVER_AUTH, True)
    client_cert, client_key = leaf("husk test client", ExtendedKeyUsageOID.CLIENT_AUTH, False)
    def put(name: str, data: bytes) -> str:
        return _write(os.path.join(directory, name), data)
    return CertFiles(ca=put("ca.pem", ca.public_bytes(serialization.Encoding.PEM)),
                     server_cert=put("server.pem", server_cert), server_key=put("server.key", server_key),
                     client_cert=put("client.pem", client_cert), client_key=put("client.key", client_key))


def client_context(certs: CertFiles, with_client_cert: bool = False) -> Any:
    import ssl
    ctx = ssl.create_default_context(cafile=certs.ca)
    if with_client_cert:
        ctx.load_cert_chain(certs.client_cert, certs.client_key)
    return ctx
