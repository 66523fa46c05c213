"""`meshca bundle fetch` against a SPIFFE bundle endpoint written here from the standard alone (Python's
ssl and http.server, keys and certificates from `cryptography`), and what it prints read by py-spiffe."""

import base64
import datetime
import json
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from spiffe.bundle.x509_bundle.x509_bundle import X509Bundle
from spiffe.spiffe_id.spiffe_id import TrustDomain

from conftest import MESHCA

TRUST_DOMAIN = "partner.example"
ENDPOINT_ID = f"spiffe://{TRUST_DOMAIN}/spire/server"


def b64url_int(n: int, length: int) -> str:
    return base64.urlsafe_b64encode(n.to_bytes(length, "big")).rstrip(b"=").decode()


def certificate(subject_key, issuer_key, issuer_name, uri, ca):
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(x509.NameOID.ORGANIZATION_NAME, TRUST_DOMAIN)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name if ca else x509.Name([]))
        .issuer_name(issuer_name or name)
        .public_key(subject_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=False)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


class Authority:
    def __init__(self):
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.cert = certificate(self.key, self.key, None, f"spiffe://{TRUST_DOMAIN}", ca=True)

    def der(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.DER)

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def jwk(self) -> dict:
        numbers = self.key.public_key().public_numbers()
        return {
            "use": "x509-svid",
            "kty": "EC",
            "crv": "P-256",
            "x": b64url_int(numbers.x, 32),
            "y": b64url_int(numbers.y, 32),
            "x5c": [base64.b64encode(self.der()).decode()],
        }


@pytest.fixture
def endpoint(tmp_path):
    """A bundle endpoint serving two authorities and a JWT key over TLS with an X.509-SVID for
    ENDPOINT_ID; yields (url, the current authority, the next one)."""
    current, following = Authority(), Authority()
    jwt_key = ec.generate_private_key(ec.SECP256R1()).public_key().public_numbers()
    document = json.dumps(
        {
            "keys": [
                current.jwk(),
                following.jwk(),
                {"use": "jwt-svid", "kty": "EC", "crv": "P-256", "kid": "jwt-1",
                 "x": b64url_int(jwt_key.x, 32), "y": b64url_int(jwt_key.y, 32)},
            ],
            "spiffe_sequence": 12,
            "spiffe_refresh_hint": 300,
        }
    ).encode()
    server_key = ec.generate_private_key(ec.SECP256R1())
    svid = certificate(server_key, current.key, current.cert.subject, ENDPOINT_ID, ca=False)
    (tmp_path / "svid.pem").write_bytes(svid.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(document)))
            self.end_headers()
            self.wfile.write(document)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "svid.pem", tmp_path / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/", current, following
    finally:
        server.shutdown()


def fetch(*args):
    return subprocess.run([MESHCA, "bundle", "fetch", *args], capture_output=True, text=True, timeout=60)


def test_bundle_fetch_checks_the_endpoints_spiffe_id_and_prints_the_peers_bundle(endpoint, tmp_path):
    url, current, following = endpoint
    held = tmp_path / "held.pem"
    held.write_bytes(current.pem())

    run = fetch(url, "--spiffe-id", ENDPOINT_ID, "--bundle-file", str(held))
    assert run.returncode == 0, run.stderr
    printed = json.loads(run.stdout)
    assert printed["spiffe_sequence"] == 12
    assert printed["spiffe_refresh_hint"] == 300
    uses = [k["use"] for k in printed["keys"]]
    assert uses == ["x509-svid", "x509-svid", "jwt-svid"], printed
    assert "sequence 12" in run.stderr

    # As PEM, py-spiffe reads the peer's two authorities, byte for byte.
    run = fetch(url, "--spiffe-id", ENDPOINT_ID, "--bundle-file", str(held), "--format", "pem")
    assert run.returncode == 0, run.stderr
    bundle = X509Bundle.parse(TrustDomain(TRUST_DOMAIN), run.stdout.encode())
    ders = sorted(c.public_bytes(serialization.Encoding.DER) for c in bundle.x509_authorities)
    assert ders == sorted([current.der(), following.der()])


def test_bundle_fetch_refuses_an_endpoint_with_another_spiffe_id_or_an_unheld_ca(endpoint, tmp_path):
    url, current, _ = endpoint
    held = tmp_path / "held.pem"
    held.write_bytes(current.pem())
    run = fetch(url, "--spiffe-id", f"spiffe://{TRUST_DOMAIN}/someone-else", "--bundle-file", str(held))
    assert run.returncode == 1, run.stdout
    assert ENDPOINT_ID in run.stderr and "someone-else" in run.stderr, run.stderr
    assert run.stdout == ""

    stranger = tmp_path / "stranger.pem"
    stranger.write_bytes(Authority().pem())
    run = fetch(url, "--spiffe-id", ENDPOINT_ID, "--bundle-file", str(stranger))
    assert run.returncode == 1, run.stdout
    assert "TLS" in run.stderr, run.stderr


def test_bundle_fetch_refuses_bad_input_with_exit_code_2(tmp_path):
    run = fetch("https://127.0.0.1:1/", "--web")
    assert run.returncode == 2, run.stderr
    assert "--trust-domain" in run.stderr
    missing = tmp_path / "missing.pem"
    run = fetch("https://127.0.0.1:1/", "--spiffe-id", ENDPOINT_ID, "--bundle-file", str(missing))
    assert run.returncode == 2, run.stderr
    assert str(missing) in run.stderr
    run = fetch("http://127.0.0.1:1/", "--web", "--trust-domain", TRUST_DOMAIN, "--ca-file", str(tmp_path))
    assert run.returncode == 2, run.stderr
