"""Federation as a peer, an operator, Envoy and a workload see it: meshca follows a SPIFFE bundle endpoint written
from the standard alone (spiffe_peer.py) through its rotation and its mistakes, and what it holds reaches Envoy's
validation contexts (Envoy's protos) and py-spiffe workloads as the foreign trust domain's bundle."""

import base64
import json
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from spiffe.bundle.x509_bundle.x509_bundle import X509Bundle
from spiffe.spiffe_id.spiffe_id import TrustDomain

from conftest import MESHCA, Daemon
from sidecars import free_port
from cryptography.hazmat.primitives.asymmetric import ec
from spiffe_peer import ENDPOINT_ID, TRUST_DOMAIN, Authority, BundleEndpoint, bundle, jwt_jwk, jwt_svid
from test_sds import MESH_SERVICES, Stream, meshservice_context, san_matchers, spiffe_bundles, unpack
from test_workload_api import ID_A, UID_A, UID_B, certs, own_context, runtime, spawn, two_workloads  # noqa: F401


def relationship(url, initial, mesh="default"):
    return (
        f'type: FederationRelationship\nname: partner\nmesh: "{mesh}"\nspec:\n  trustDomain: {TRUST_DOMAIN}\n'
        f"  bundleEndpoint:\n    url: {url}\n    profile: https_spiffe\n    spiffeID: {ENDPOINT_ID}\n"
        f"  initialBundle: {{file: {initial}}}\n"
    )


def until(what, poll, done, timeout=30):
    """Polls `poll()` until `done(value)`; the last value, or an error naming `what` and it."""
    deadline = time.monotonic() + timeout
    while True:
        value = poll()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: {value}")
        time.sleep(0.1)


def partner(daemon):
    entries = [e for e in daemon.api("/api/status")["federation"] if e["trust_domain"] == TRUST_DOMAIN]
    return entries[0] if entries else None


def pems(text):
    return [x509.load_pem_x509_certificate(p.encode()) for p in text.split("-----END CERTIFICATE-----") if p.strip()
            for p in [p + "-----END CERTIFICATE-----\n"]]  # fmt: skip


def test_a_peer_is_followed_through_its_rotation_into_envoys_validation_context(tmp_path):
    current, following = Authority(), Authority()
    peer = BundleEndpoint(current, bundle([current.jwk(), jwt_jwk("k1")], 1))
    initial = tmp_path / "partner.pem"
    initial.write_bytes(current.pem())
    daemon = Daemon(tmp_path, resources={"partner.yaml": relationship(peer.url, initial)})
    try:
        status = until("the first fetch", lambda: partner(daemon),
                       lambda s: s is not None and s["held_from"] == "fetched")  # fmt: skip
        assert status["sequence"] == 1 and status["condition"] == "Fresh", status
        assert status["relationships"] == ["default/partner"] and status["profile"] == "https_spiffe"
        assert status["jwt_authorities"] == 1 and status["last_error"] is None

        # The mesh's validation context holds the foreign trust domain with the SPIFFE validator.
        stream = Stream(daemon.unix_channel(), daemon.token("web"), "default.web")
        stream.send(["system_trust_bundle"])
        first = stream.recv()
        bundles = spiffe_bundles(unpack(first.resources[0]))
        assert pems(bundles[TRUST_DOMAIN]) == [current.cert]
        assert "default" in bundles, sorted(bundles)
        stream.send(["system_trust_bundle"], version=first.version_info, nonce=first.nonce)

        # The peer prepares its next CA; SIGHUP fetches at once, and the open stream gets both.
        peer.document = bundle([current.jwk(), following.jwk()], 2)
        daemon.proc.send_signal(signal.SIGHUP)
        update = stream.recv(timeout=30)
        assert sorted(c.serial_number for c in pems(spiffe_bundles(unpack(update.resources[0]))[TRUST_DOMAIN])) == \
            sorted([current.cert.serial_number, following.cert.serial_number])  # fmt: skip
        stream.close()

        # A sequence going backwards is refused whole and said; the bundle of sequence 2 keeps serving.
        peer.document = bundle([following.jwk()], 1)
        daemon.proc.send_signal(signal.SIGHUP)
        status = until("the refusal", lambda: partner(daemon), lambda s: s["fetches"]["refused"] == 1)
        assert "went backwards, from 2 to 1" in status["last_error"], status
        assert status["sequence"] == 2 and status["x509_authorities"] == 2

        with urllib.request.urlopen(f"http://127.0.0.1:{daemon.admin_port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert f'meshca_federation_bundle_age_seconds{{trust_domain="{TRUST_DOMAIN}"}}' in metrics
        assert f'meshca_federation_bundle_sequence{{trust_domain="{TRUST_DOMAIN}"}} 2' in metrics
        assert f'meshca_federation_fetches_total{{trust_domain="{TRUST_DOMAIN}",result="refused"}} 1' in metrics
        assert f'meshca_federation_bundle_stale{{trust_domain="{TRUST_DOMAIN}"}} 0' in metrics

        shown = daemon.cli("status", "--admin", f"127.0.0.1:{daemon.admin_port}").stdout
        assert f"{TRUST_DOMAIN} (Fresh): https_spiffe {peer.url}, for default/partner" in shown, shown
        assert "went backwards" in shown and "refused 1" in shown, shown
    finally:
        daemon.stop()
        peer.close()
    assert daemon.proc.returncode == 0, daemon.log_text()


def test_a_restart_during_the_peers_outage_serves_the_stored_bundle(tmp_path):
    current, following = Authority(), Authority()
    peer = BundleEndpoint(current, bundle([current.jwk(), following.jwk()], 7))
    initial = tmp_path / "partner.pem"
    initial.write_bytes(current.pem())
    daemon = Daemon(tmp_path, resources={"partner.yaml": relationship(peer.url, initial)})
    try:
        until("the first fetch", lambda: partner(daemon), lambda s: s is not None and s["sequence"] == 7)
        daemon.proc.kill()
        daemon.proc.wait()
        daemon.log.close()
        peer.status = 503
        daemon.start()
        status = until("the failed fetch", lambda: partner(daemon), lambda s: s["fetches"]["failed"] >= 1)
        assert status["held_from"] == "stored" and status["sequence"] == 7, status
        assert "503" in status["last_error"]
        stream = Stream(daemon.unix_channel(), daemon.token("web"), "default.web")
        stream.send(["system_trust_bundle"])
        held = pems(spiffe_bundles(unpack(stream.recv().resources[0]))[TRUST_DOMAIN])
        assert sorted(c.serial_number for c in held) == sorted([current.cert.serial_number,
                                                               following.cert.serial_number])  # fmt: skip
        stream.close()
    finally:
        daemon.stop()
        peer.close()


def test_a_workload_gets_the_foreign_trust_domain_as_a_federated_bundle(workload_daemon, spawn, tmp_path):  # noqa: F811
    current = Authority()
    peer = BundleEndpoint(current, bundle([current.jwk()], 1))
    initial = tmp_path / "partner.pem"
    initial.write_bytes(current.pem())
    try:
        workload_daemon({**two_workloads(), "partner.yaml": relationship(peer.url, initial)})
        ctx = own_context(spawn(UID_A, "context", TRUST_DOMAIN), ID_A)
        assert certs(ctx["lookup"][TRUST_DOMAIN]) == [current.cert]
    finally:
        peer.close()


def test_a_bad_relationship_is_refused_naming_its_file_resource_and_field(tmp_path):
    resources = tmp_path / "resources"
    resources.mkdir()
    (resources / "mesh.yaml").write_text("type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n")
    (resources / "partner.yaml").write_text(relationship("https://127.0.0.1:1/", tmp_path / "missing.pem"))
    (resources / "local.yaml").write_text(
        relationship("https://127.0.0.1:1/", tmp_path / "missing.pem", mesh="*").replace("name: partner", "name: x")
    )
    run = subprocess.run([MESHCA, "validate", str(resources)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    out = run.stdout + run.stderr
    # Files are read in name order: local.yaml's relationship for every mesh comes first.
    assert "local.yaml: FederationRelationship/*/x: spec.initialBundle.file" in out, out
    assert "missing.pem: No such file" in out
    assert "partner.yaml: FederationRelationship/default/partner: mesh:" in out, out
    assert "already federates mesh default with trust domain partner.example" in out, out


def fetch_as_a_peer(port, authorities):
    """GET / from meshca's endpoint as a peer written from the standard would: TLS checked against the
    authorities it holds for the trust domain, the server's X.509-SVID its endpoint ID; the JSON and that ID."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # an X.509-SVID names a SPIFFE ID, not a host
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=b"".join(a.public_bytes(serialization.Encoding.PEM) for a in authorities).decode())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw) as tls:
            peer = x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))
            tls.sendall(b"GET / HTTP/1.1\r\nHost: meshca\r\nConnection: close\r\n\r\n")
            response = b""
            while chunk := tls.recv(65536):
                response += chunk
    head, body = response.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200"), head
    sans = peer.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return json.loads(body), [str(u) for u in sans.get_values_for_type(x509.UniformResourceIdentifier)]


def test_meshca_serves_its_trust_domain_to_a_peer_written_from_the_standard(tmp_path):
    port = free_port()
    daemon = Daemon(
        tmp_path,
        settings=f'federation:\n  endpoints:\n    - {{trustDomain: default, listen: "127.0.0.1:{port}"}}\n',
    )
    try:
        admin = f"127.0.0.1:{daemon.admin_port}"
        shown = until("a bundle to show", lambda: daemon.cli("bundle", "show", "--admin", admin, check=False),
                      lambda run: run.returncode == 0)  # fmt: skip
        document = json.loads(shown.stdout)
        assert document["spiffe_sequence"] == 1 and document["spiffe_refresh_hint"] == 300, document
        x509_keys = [k for k in document["keys"] if k["use"] == "x509-svid"]
        assert x509_keys and all(k["kty"] == "EC" and len(k["x5c"]) == 1 for k in x509_keys), document
        authorities = [x509.load_der_x509_certificate(base64.b64decode(k["x5c"][0])) for k in x509_keys]
        assert "sequence 1" in shown.stderr

        # py-spiffe reads the PEM form: the same authorities.
        pem = daemon.cli("bundle", "show", "--admin", admin, "--format", "pem").stdout
        bundle = X509Bundle.parse(TrustDomain("default"), pem.encode())
        assert sorted(c.serial_number for c in bundle.x509_authorities) == sorted(a.serial_number for a in authorities)

        # A peer fetches what meshca serves, the endpoint proving itself with its X.509-SVID.
        fetched, ids = until("the endpoint's SVID", lambda: _try_fetch(port, authorities), lambda r: r is not None)
        assert fetched == document
        assert ids == ["spiffe://default/meshca/bundle-endpoint"]

        status = daemon.api("/api/status")["federation_endpoints"]
        assert status[0]["trust_domain"] == "default" and status[0]["sequence"] == 1, status
        assert status[0]["fetched_by"][0]["peer"] == "127.0.0.1", status
        try:
            urllib.request.urlopen(f"http://{admin}/api/bundles/nowhere.example", timeout=5)
            raise AssertionError("a trust domain no endpoint serves was answered")
        except urllib.error.HTTPError as e:
            assert e.code == 404 and "no bundle endpoint serves" in e.read().decode()
    finally:
        daemon.stop()
    assert daemon.proc.returncode == 0, daemon.log_text()


def _try_fetch(port, authorities):
    try:
        return fetch_as_a_peer(port, authorities)
    except (ssl.SSLError, ConnectionError):
        return None


def test_a_meshservice_of_another_zone_is_checked_by_its_federated_trust_domain(tmp_path):
    current = Authority()
    peer = BundleEndpoint(current, bundle([current.jwk()], 1))
    initial = tmp_path / "partner.pem"
    initial.write_bytes(current.pem())
    daemon = Daemon(tmp_path, resources={"partner.yaml": relationship(peer.url, initial), "services.yaml": MESH_SERVICES})
    try:
        token = daemon.token("client-1", "default", "--tag", "kuma.io/service=client")
        # Cross-zone identities: the SPIFFE IDs the other zone's service arrived with, checked by the CAs of
        # their own trust domain, which only the federation brings.
        context = meshservice_context(daemon, token, "meshservice:partner")
        assert "spiffe://partner.example/web" in san_matchers(context)
        assert pems(spiffe_bundles(context)[TRUST_DOMAIN]) == [current.cert]
    finally:
        daemon.stop()
        peer.close()
    assert daemon.proc.returncode == 0, daemon.log_text()


def test_a_workload_validates_a_partners_jwt_svid_with_its_federated_keys(workload_daemon, spawn, tmp_path):  # noqa: F811
    current, signer = Authority(), ec.generate_private_key(ec.SECP256R1())
    document = bundle([current.jwk(), jwt_jwk("partner-key-1", signer)], 1)
    peer = BundleEndpoint(current, document)
    initial = tmp_path / "partner.json"
    initial.write_bytes(document)  # the SPIFFE bundle, JWT key included, held from the start
    try:
        workload_daemon({**two_workloads(), "partner.yaml": relationship(peer.url, initial)})
        # py-spiffe reads the partner's JWT bundle from FetchJWTBundles.
        assert spawn(UID_A, "jwt_bundle", TRUST_DOMAIN).next() == {"kids": ["partner-key-1"]}
        # A token the partner signed validates for its audience, by the partner's SPIFFE ID...
        partner_id = f"spiffe://{TRUST_DOMAIN}/billing"
        token = jwt_svid(signer, "partner-key-1", partner_id, ID_A)
        assert spawn(UID_A, "validate", token, ID_A).next() == {"spiffe_id": partner_id}
        # ...and one signed by a key the partner never published does not.
        forged = jwt_svid(ec.generate_private_key(ec.SECP256R1()), "partner-key-1", partner_id, ID_A)
        refused = spawn(UID_A, "validate", forged, ID_A).next()
        assert "error" in refused, refused
    finally:
        peer.close()
