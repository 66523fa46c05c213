"""Federation as a peer, an operator, Envoy and a workload see it: meshca follows a SPIFFE bundle endpoint written
from the standard alone (spiffe_peer.py) through its rotation and its mistakes, and what it holds reaches Envoy's
validation contexts (Envoy's protos) and py-spiffe workloads as the foreign trust domain's bundle."""

import signal
import subprocess
import time
import urllib.request

from cryptography import x509

from conftest import MESHCA, Daemon
from spiffe_peer import ENDPOINT_ID, TRUST_DOMAIN, Authority, BundleEndpoint, bundle, jwt_jwk
from test_sds import Stream, spiffe_bundles, unpack
from test_workload_api import ID_A, UID_A, certs, own_context, runtime, spawn, two_workloads  # noqa: F401


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
    (resources / "mesh.yaml").write_text("type: Mesh\nname: default\n")
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
