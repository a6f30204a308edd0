"""The streaming server's TLS context from PEM files: certificate, key, and optionally a CA for client certificates.

Owns reading and checking those files so that a bad one is named in the error. It does not know husk-cri's
config keys (the caller maps `TlsFileError.which` to them) and never creates certificates.
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass


class TlsFileError(ValueError):
    """A TLS file is missing, unreadable or not what it should be; `which` is "cert", "key" or "ca"."""

    def __init__(self, which: str, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.which = which
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str
    key_file: str
    ca_file: str = ""  # non-empty: clients must present a certificate signed by it


def _read(which: str, path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise TlsFileError(which, path, f"cannot read: {e.strerror or e}") from None
    return data.decode("latin-1")


def _check_pem(which: str, path: str, text: str) -> None:
    if which == "key":
        if "PRIVATE KEY-----" not in text:
            raise TlsFileError(which, path, "no PEM private key in it")
        return
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise TlsFileError(which, path, "no PEM certificate in it")
    if text.count("-----BEGIN CERTIFICATE-----") != text.count("-----END CERTIFICATE-----"):
        raise TlsFileError(which, path, "a certificate has no END line (truncated?)")
    # Parsed on its own, so that a garbled certificate is named here rather than in an "[SSL] PEM lib" error
    # about the certificate and key together.
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cadata=text)
    except ssl.SSLError as e:
        raise TlsFileError(which, path, f"a certificate does not parse: {e.reason or e}") from None


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A TLS 1.2+ server context; TlsFileError names the file at fault and why."""
    for which, path in (("cert", files.cert_file), ("key", files.key_file), ("ca", files.ca_file)):
        if path:
            _check_pem(which, path, _read(which, path))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(files.cert_file, files.key_file)
    except ssl.SSLError as e:
        if "KEY_VALUES_MISMATCH" in str(e) or "key values mismatch" in str(e):
            raise TlsFileError("key", files.key_file, f"does not match the certificate in {files.cert_file}") \
                from None
        raise TlsFileError("key", files.key_file, f"cannot be loaded with {files.cert_file}: "
                                                  f"{e.reason or e}") from None
    except OSError as e:
        raise TlsFileError("cert", files.cert_file, f"cannot load: {e.strerror or e}") from None
    if files.ca_file:
        try:
            ctx.load_verify_locations(cafile=files.ca_file)
        except (ssl.SSLError, OSError) as e:
            raise TlsFileError("ca", files.ca_file, f"cannot load as a CA bundle: {e}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx

