"""Azure's far side on the loopback interface: ARM for one Azure ML workspace, and its blob storage.

azure-ai-ml is used exactly as in production: `MLClient` on the public cloud, its HTTP pipeline, requests
and TLS. The process is pointed at this server as its HTTPS proxy (`HTTPS_PROXY`), so every request still
goes to its real host (management.azure.com, <account>.blob.core.windows.net); the server answers each
tunnel (CONNECT) with TLS under a certificate that a test authority made for those hosts, and the process
trusts only that authority (`REQUESTS_CA_BUNDLE`). A host it does not stand in for is refused, so nothing
can leak to the network. The one thing faked on the near side is the AAD token (`FixedToken`).

Each request is recorded (host, method, path, api-version, JSON body) and answered as Azure ML's REST API
documents it: resources carry id, name, type, properties and systemData; a missing one is a 404 with an
ARM error body; PUT answers 201 with what was stored; a schedule PUT is a long-running operation.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import re
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

ARM_HOST = "management.azure.com"
BLOB_SUFFIX = ".blob.core.windows.net"
ML_PROVIDER = "Microsoft.MachineLearningServices"
ARM_AUDIENCE = "https://management.azure.com"


# -- the near side's one fake: the token ----------------------------------------------------------------


TENANT = "72f988bf-0000-4000-8000-00000000a1a1"


@dataclass(frozen=True)
class FixedToken:
    """A credential whose `get_token` returns a fixed token (AAD is Azure's control plane too).

    Shaped as AAD's: a JWT whose audience is the resource of the scope asked for, with the tenant (`tid`)
    and the caller (`oid`). azure-ai-ml reads those claims (unverified): `tid` for the studio URL, and a
    pipeline submission checks that its Azure ML token's `aud` is https://ml.azure.com/. Unsigned: nothing
    on the far side checks a signature."""

    scopes: list[tuple[str, ...]] = field(default_factory=list)

    def get_token(self, *scopes: str, **_: Any) -> Any:
        from azure.core.credentials import AccessToken

        self.scopes.append(scopes)
        expires = int(dt.datetime.now(dt.UTC).timestamp()) + 3600
        claims = {
            "aud": scopes[0].removesuffix("/.default") if scopes else ARM_AUDIENCE,
            "iss": f"https://sts.windows.net/{TENANT}/",
            "tid": TENANT,
            "oid": "0d4a3c7e-5b1f-4e8a-9c2d-7f6e5a4b3c21",
            "exp": expires,
        }
        parts = ({"alg": "RS256", "typ": "JWT", "kid": "loopback"}, claims)
        encoded = [
            base64.urlsafe_b64encode(json.dumps(part).encode()).rstrip(b"=").decode() for part in parts
        ]
        return AccessToken(".".join([*encoded, "bG9vcGJhY2s"]), expires)


# -- TLS: a test authority and a certificate for the stood-in hosts ------------------------------------


def write_test_authority(folder: Path, hosts: tuple[str, ...]) -> tuple[Path, Path, Path]:
    """A CA (ca.pem) and a server certificate and key signed by it for `hosts` (wildcards allowed)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "retrain loopback test authority")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host) for host in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    paths = (folder / "ca.pem", folder / "server.pem", folder / "server.key")
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(server.public_bytes(pem))
    paths[2].write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


# -- what was sent ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    """One request as it reached the far side."""

    host: str
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any  # parsed JSON, raw bytes, or None
    raw: bytes = field(default=b"", repr=False)
    target: str = ""  # the path and query exactly as sent (a SAS signature must not be re-encoded)

    @property
    def api_version(self) -> str | None:
        return self.query.get("api-version")

    @property
    def line(self) -> str:
        """`METHOD host/path?api-version=...`, the short form a test compares sequences in."""
        version = f"?api-version={self.api_version}" if self.api_version else ""
        return f"{self.method} {self.host}{self.path}{version}"


class _SocketWriter(io.BufferedIOBase):
    """Unbuffered writes to a (TLS) socket, all bytes or an error, as socketserver's own writer does."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._sock.sendall(data)
        return len(data)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Response:
    def __init__(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
        self.status, self.body, self.headers = status, body, headers or {}


def arm_error(status: int, code: str, message: str) -> Response:
    """ARM's error contract: {"error": {"code", "message"}}."""
    return Response(status, {"error": {"code": code, "message": message}})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: AzureStandIn
    tunnel_host: str | None = None

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the requests are recorded; the default logger would write each to stderr

    def do_CONNECT(self) -> None:
        host, _, port = self.path.rpartition(":")
        if port != "443" or not self.server.stands_in_for(host):
            self.send_error(403, f"no stand-in for {self.path}")
            self.close_connection = True
            return
        self.send_response(200, "Connection Established")
        self.end_headers()
        self.connection = self.server.tls.wrap_socket(self.connection, server_side=True)
        self.rfile = self.connection.makefile("rb", self.rbufsize)
        self.wfile = _SocketWriter(self.connection)  # type: ignore[assignment]
        self.tunnel_host = host
        self.close_connection = False  # urllib3 asks in HTTP/1.0, which would end the tunnel here

    def _serve(self) -> None:
        if self.tunnel_host is None:
            self.send_error(400, "only TLS tunnels (CONNECT) are served")
            return
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body: Any = raw or None
        if raw and "json" in (self.headers.get("Content-Type") or ""):
            body = json.loads(raw)
        sent = Sent(
            host=self.tunnel_host,
            method=self.command,
            path=url.path,
            query=dict(parse_qsl(url.query, keep_blank_values=True)),
            headers={name.lower(): value for name, value in self.headers.items()},
            body=body,
            raw=raw,
            target=self.path,
        )
        response = self.server.answer(sent)
        payload = (
            b""
            if response.body is None
            else (response.body if isinstance(response.body, bytes) else json.dumps(response.body).encode())
        )
        self.send_response(response.status)
        if response.body is not None and not isinstance(response.body, bytes):
            self.send_header("Content-Type", "application/json; charset=utf-8")
        for name, value in response.headers.items():
            self.send_header(name, value)
        if not (self.command == "HEAD" and "content-length" in {name.lower() for name in response.headers}):
            self.send_header("Content-Length", str(len(payload)))
        self.send_header("x-ms-request-id", f"loopback-{len(self.server.sent)}")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _serve


class AzureStandIn(ThreadingHTTPServer):
    """The proxy-and-server: records every request, and answers it from `answer` (a routing callable)."""

    daemon_threads = True

    def __init__(self, folder: Path, hosts: tuple[str, ...], answer: Any) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ca_file, cert, key = write_test_authority(folder, hosts)
        self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.tls.load_cert_chain(cert, key)
        self._patterns = [
            re.compile("^" + re.escape(host).replace(r"\*", "[a-z0-9-]+") + "$") for host in hosts
        ]
        self._answer = answer
        self._lock = threading.Lock()
        self.sent: list[Sent] = []
        self._thread = threading.Thread(target=self.serve_forever, name="azure-stand-in", daemon=True)

    @property
    def proxy_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def stands_in_for(self, host: str) -> bool:
        return any(pattern.match(host.lower()) for pattern in self._patterns)

    def answer(self, sent: Sent) -> Response:
        with self._lock:
            self.sent.append(sent)
            return self._answer(sent)

    def start(self) -> AzureStandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join()

    def take(self) -> list[Sent]:
        """The requests recorded since the last take, oldest first."""
        with self._lock:
            taken, self.sent = self.sent, []
        return taken

    def __iter__(self) -> Iterator[Sent]:
        return iter(list(self.sent))
