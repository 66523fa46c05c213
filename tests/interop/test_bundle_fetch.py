"""`meshca bundle fetch` against a SPIFFE bundle endpoint written from the standard alone (spiffe_peer.py),
and what it prints read by py-spiffe."""

import json
import subprocess

import pytest
from cryptography.hazmat.primitives import serialization
from spiffe.bundle.x509_bundle.x509_bundle import X509Bundle
from spiffe.spiffe_id.spiffe_id import TrustDomain

from conftest import MESHCA
from spiffe_peer import ENDPOINT_ID, TRUST_DOMAIN, Authority, BundleEndpoint, bundle, jwt_jwk


@pytest.fixture
def endpoint():
    """A bundle endpoint serving two authorities and a JWT key; yields (url, the current authority, the next
    one)."""
    current, following = Authority(), Authority()
    peer = BundleEndpoint(current, bundle([current.jwk(), following.jwk(), jwt_jwk("jwt-1")], 12))
    try:
        yield peer.url, current, following
    finally:
        peer.close()


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
