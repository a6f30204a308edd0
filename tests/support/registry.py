"""A local OCI registry for tests: the distro's docker-registry (distribution 2.8) on 127.0.0.1:<free port>,
open, with htpasswd (Basic) auth, or with a token server run in-process (Bearer JWTs signed by a test key).

Only loopback is used. Processes are stopped by their own pid.
"""
from __future__ import annotations

import base64
import contextlib
import datetime
import http.server
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

from tests.support.waiting import wait_for

REGISTRY_BIN = shutil.which("docker-registry") or "/usr/bin/docker-registry"
SKOPEO = shutil.which("skopeo") or "/usr/bin/skopeo"
USER, PASSWORD = "husk", "s3cret-pass"
REFRESH_TOKEN = "husk-refresh-token"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


class TokenServer:
    """Issues registry JWTs for USER/PASSWORD (and anonymous pulls of `public/*` when `anonymous_pull`)."""

    def __init__(self, workdir: str, service: str = "husk-test-registry", issuer: str = "husk-test-issuer",
                 anonymous_pull: bool = False) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID
        self.service, self.issuer, self.anonymous_pull = service, issuer, anonymous_pull
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "husk test token signer")])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(days=1))
                     .not_valid_after(now + datetime.timedelta(days=30))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.cert_path = os.path.join(workdir, "token-signer.pem")
        with open(self.cert_path, "wb") as f:
            f.write(self.cert.public_bytes(serialization.Encoding.PEM))
        self._der = self.cert.public_bytes(serialization.Encoding.DER)
        self.requests: list[dict[str, object]] = []
        self._httpd: http.server.ThreadingHTTPServer | None = None
        self.port = 0

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    def sign(self, claims: dict[str, object]) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(self._der).decode()]}
        signing_input = _b64url(json.dumps(header).encode()) + "." + _b64url(json.dumps(claims).encode())
        sig = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return signing_input + "." + _b64url(sig)

    def issue(self, user: str | None, scopes: list[str]) -> str:
        now = int(time.time())
        return self.sign({"iss": self.issuer, "sub": user or "", "aud": self.service, "exp": now + 300,
                          "nbf": now - 10, "iat": now, "jti": base64.b16encode(os.urandom(8)).decode(),
                          "access": self.grant(user, scopes)})

    def grant(self, user: str | None, scopes: list[str]) -> list[dict[str, object]]:
        access = []
        for s in scopes:
            parts = s.split(":")
            if len(parts) != 3 or parts[0] != "repository":
                continue
            actions = parts[2].split(",")
            if user == USER:
                allowed = actions
            elif self.anonymous_pull and parts[1].startswith("public/"):
                allowed = [a for a in actions if a == "pull"]
            else:
                allowed = []
            access.append({"type": "repository", "name": parts[1], "actions": allowed})
        return access

    def start(self) -> None:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            disable_nagle_algorithm = True
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, code: int, obj: dict[str, object]) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                q = urllib.parse.urlparse(self.path)
                params = urllib.parse.parse_qs(q.query)
                user = None
                authz = self.headers.get("Authorization", "")
                if authz.startswith("Basic "):
                    u, _, p = base64.b64decode(authz[6:]).decode().partition(":")
                    if (u, p) != (USER, PASSWORD):
                        server.requests.append({"user": u, "denied": True})
                        self._reply(401, {"details": "bad credentials"})
                        return
                    user = u
                scopes = [x for s in params.get("scope", []) for x in s.split(" ")]
                server.requests.append({"user": user, "scopes": scopes, "service": params.get("service")})
                self._reply(200, {"token": server.issue(user, scopes), "expires_in": 300})

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                form = urllib.parse.parse_qs(self.rfile.read(n).decode())
                if form.get("grant_type") != ["refresh_token"] or form.get("refresh_token") != [REFRESH_TOKEN]:
                    server.requests.append({"refresh": True, "denied": True})
                    self._reply(401, {"details": "bad refresh token"})
                    return
                scopes = [x for s in form.get("scope", []) for x in s.split(" ")]
                server.requests.append({"user": USER, "scopes": scopes, "refresh": True})
                self._reply(200, {"access_token": server.issue(USER, scopes), "expires_in": 300})

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, name="token-server", daemon=True).start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


class LocalRegistry:
    """docker-registry on 127.0.0.1. auth: None (open), 'htpasswd' or 'token'."""

    def __init__(self, workdir: str, auth: str | None = None, storage: str | None = None,
                 anonymous_pull: bool = False, tls: bool = False) -> None:
        self.tls = tls
        self.ca_path = os.path.join(workdir, "ca", "ca.crt")  # its own dir: skopeo's --dest-cert-dir
        self.workdir = workdir
        self.auth = auth
        self.storage = storage or os.path.join(workdir, "storage")
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.token: TokenServer | None = None
        self.anonymous_pull = anonymous_pull
        self.log_path = os.path.join(workdir, "registry.log")

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _config(self) -> str:
        lines = ["version: 0.1", "log:", "  level: warn", "  accesslog:", "    disabled: true", "storage:",
                 "  filesystem:", f"    rootdirectory: {self.storage}", "  delete:", "    enabled: true",
                 "http:", f"  addr: {self.addr}"]
        if self.tls:
            cert, key = self._make_tls()
            lines += ["  tls:", f"    certificate: {cert}", f"    key: {key}"]
        if self.auth == "htpasswd":
            import bcrypt
            hp = os.path.join(self.workdir, "htpasswd")
            with open(hp, "w") as f:
                f.write(f"{USER}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=5)).decode()}\n")
            lines += ["auth:", "  htpasswd:", "    realm: husk-test", f"    path: {hp}"]
        elif self.auth == "token":
            self.token = TokenServer(self.workdir, anonymous_pull=self.anonymous_pull)
            self.token.start()
            lines += ["auth:", "  token:", f"    realm: {self.token.realm}", f"    service: {self.token.service}",
                      f"    issuer: {self.token.issuer}", f"    rootcertbundle: {self.token.cert_path}"]
        elif self.auth is not None:
            raise ValueError(f"unknown auth {self.auth!r}")
        path = os.path.join(self.workdir, "registry.yml")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def _make_tls(self) -> tuple[str, str]:
        """A test CA (written to ca_path) and a server certificate for 127.0.0.1 signed by it."""
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "husk test CA")])
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
              .not_valid_after(now + datetime.timedelta(days=30))
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                           content_commitment=False, key_encipherment=False,
                                           data_encipherment=False, key_agreement=False, encipher_only=False,
                                           decipher_only=False), critical=True)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
                .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
                .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                               critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        cert_path, key_path = os.path.join(self.workdir, "server.pem"), os.path.join(self.workdir, "server.key")
        os.makedirs(os.path.dirname(self.ca_path), exist_ok=True)
        with open(self.ca_path, "wb") as f:
            f.write(ca.public_bytes(serialization.Encoding.PEM))
        with open(cert_path, "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        with open(key_path, "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
        return cert_path, key_path

    def start(self, attempts: int = 5) -> None:
        os.makedirs(self.storage, exist_ok=True)
        for _ in range(attempts):
            self.port = free_port()
            conf = self._config()
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen([REGISTRY_BIN, "serve", conf], stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL)
            log.close()
            try:
                if wait_for(self._up_or_exited, 15, f"docker-registry to answer on {self.addr}") == "up":
                    return
            except AssertionError:
                self.stop()
                raise
            self.stop()  # exited: the port was taken between free_port() and bind, try another
        with open(self.log_path, errors="replace") as f:
            raise RuntimeError(f"docker-registry did not start: {f.read()[-2000:]}")

    def _up_or_exited(self) -> str | None:
        """"up" once /v2/ answers, "exited" if the process ended, None meanwhile."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            return "exited"
        try:
            if self.tls:
                import ssl
                ctx = ssl.create_default_context(cafile=self.ca_path)
                urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                            urllib.request.HTTPSHandler(context=ctx)).open(
                    f"https://{self.addr}/v2/", timeout=1).close()
            else:
                _NO_PROXY.open(f"http://{self.addr}/v2/", timeout=1).close()
            return "up"
        except urllib.error.HTTPError:
            return "up"  # 401 from an auth registry: it is up
        except OSError:
            return None

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None
        if self.token is not None:
            self.token.stop()
            self.token = None

    def push(self, layout: str, repo_tag: str, src_tag: str = "latest") -> None:
        """skopeo copy oci:<layout>:<src_tag> docker://<addr>/<repo_tag> (with credentials on auth registries)."""
        cmd = [SKOPEO, "copy", "--quiet", "--preserve-digests"]
        cmd += [f"--dest-cert-dir={os.path.dirname(self.ca_path)}"] if self.tls else ["--dest-tls-verify=false"]
        if self.auth:
            cmd += ["--dest-creds", f"{USER}:{PASSWORD}"]
        cmd += [f"oci:{layout}:{src_tag}", f"docker://{self.addr}/{repo_tag}"]
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"skopeo push {repo_tag} failed: {p.stderr.strip()}")

    def url(self, path: str) -> str:
        return f"http://{self.addr}{path}"

    def blob_file(self, digest: str) -> str:
        """Where the registry's filesystem driver keeps a blob (to corrupt it in hostile tests)."""
        algo, hexpart = digest.split(":", 1)
        return os.path.join(self.storage, "docker", "registry", "v2", "blobs", algo, hexpart[:2], hexpart, "data")


def write_hosts_toml(config_dir: str, registry_host: str, server: str, mirrors: list[str] | None = None) -> str:
    """A containerd-style hosts.toml for `registry_host` whose only endpoints are `server` (and `mirrors`)."""
    d = os.path.join(config_dir, registry_host)
    os.makedirs(d, exist_ok=True)
    lines = [f'server = "{server}"', ""]
    for m in (mirrors or []) + [server]:
        lines += [f'[host."{m}"]', '  capabilities = ["pull", "resolve"]', ""]
    path = os.path.join(d, "hosts.toml")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


@contextlib.contextmanager
def running(workdir: str, auth: str | None = None, **kw: object) -> Iterator[LocalRegistry]:
    os.makedirs(workdir, exist_ok=True)
    reg = LocalRegistry(workdir, auth, **kw)  # type: ignore[arg-type]
    reg.start()
    try:
        yield reg
    finally:
        reg.stop()
