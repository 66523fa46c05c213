"""A SPIFFE bundle endpoint written from the SPIFFE Trust Domain and Bundle and SPIFFE Federation standards
alone (Python's ssl and http.server, keys and certificates from `cryptography`), never with meshca's code: the
federation peer of the interop tests."""

import base64
import datetime
import json
import ssl
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

TRUST_DOMAIN = "partner.example"
ENDPOINT_ID = f"spiffe://{TRUST_DOMAIN}/spire/server"


def b64url_int(n: int, length: int) -> str:
    return base64.urlsafe_b64encode(n.to_bytes(length, "big")).rstrip(b"=").decode()


def certificate(subject_key, issuer_key, issuer_name, uri, ca, trust_domain=TRUST_DOMAIN):
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(x509.NameOID.ORGANIZATION_NAME, trust_domain)])
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
    def __init__(self, trust_domain=TRUST_DOMAIN):
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.cert = certificate(
            self.key, self.key, None, f"spiffe://{trust_domain}", ca=True, trust_domain=trust_domain
        )

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



def jwt_jwk(kid, key=None):
    numbers = (key or ec.generate_private_key(ec.SECP256R1())).public_key().public_numbers()
    return {"use": "jwt-svid", "kty": "EC", "crv": "P-256", "kid": kid,
            "x": b64url_int(numbers.x, 32), "y": b64url_int(numbers.y, 32)}  # fmt: skip


def jwt_svid(key, kid, subject, audience, lifetime=300):
    """A JWT-SVID signed ES256 by `key`, as the JWT-SVID standard describes it."""
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    def b64(data):
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    header = b64(json.dumps({"alg": "ES256", "kid": kid, "typ": "JWT"}).encode())
    now = int(datetime.datetime.now(datetime.timezone.utc).timestamp())
    claims = b64(json.dumps({"sub": subject, "aud": [audience], "exp": now + lifetime, "iat": now}).encode())
    r, s = decode_dss_signature(key.sign(f"{header}.{claims}".encode(), ec.ECDSA(hashes.SHA256())))
    return f"{header}.{claims}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def bundle(keys, sequence, refresh_hint=300):
    return json.dumps({"keys": keys, "spiffe_sequence": sequence, "spiffe_refresh_hint": refresh_hint}).encode()


class BundleEndpoint:
    """Serves `document` (changeable) to every GET over TLS with an X.509-SVID for ENDPOINT_ID issued by
    `authority`; counts the requests it answered."""

    def __init__(self, authority, document, status=200):
        self.document = document
        self.status = status
        self.requests = 0
        directory = Path(tempfile.mkdtemp(prefix="peer-"))
        server_key = ec.generate_private_key(ec.SECP256R1())
        svid = certificate(server_key, authority.key, authority.cert.subject, ENDPOINT_ID, ca=False)
        (directory / "svid.pem").write_bytes(svid.public_bytes(serialization.Encoding.PEM))
        (directory / "key.pem").write_bytes(
            server_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = endpoint.document
                self.send_response(endpoint.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                endpoint.requests += 1

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(directory / "svid.pem", directory / "key.pem")
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/"

    def close(self):
        self.server.shutdown()
