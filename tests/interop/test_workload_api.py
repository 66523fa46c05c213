"""meshca's SPIFFE Workload API as workloads see it: py-spiffe and spiffe-tls clients (workloads.py) run as other
uids with setpriv, so that meshca tells them apart by their process alone; what they get is checked with
cryptography, none of which meshca wrote."""

import base64
import datetime
import hashlib
import os
import shutil
import stat
import time
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from spiffe._proto import workload_pb2, workload_pb2_grpc

from workload_clients import Workload, build_runtime

UID_A, UID_B, UID_C = 10001, 10002, 10003
TRUST_DOMAIN = "default.default.mesh.local"
ID_A, ID_B, ID_C = (f"spiffe://{TRUST_DOMAIN}/workload/{w}" for w in ("a", "b", "c"))
ID_WEB = "spiffe://default/web"  # legacy mTLS: spiffe://<mesh>/<kuma.io/service>
HEADER = (("workload.spiffe.io", "true"),)

MESH_IDENTITY = """\
type: MeshIdentity
name: identity
mesh: default
spec:
  selector:
    dataplane:
      matchLabels: {}
  spiffeID:
    trustDomain: "{{ .Mesh }}.{{ .Zone }}.mesh.local"
    path: "/workload/{{ .Workload }}"
  provider:
    type: Bundled
    bundled:
      meshTrustCreation: Enabled
      autogenerate:
        enabled: true
"""

# A legacy mesh: ca-1 issues; ROTATED switches to ca-2 keeping ca-1 trusted, RETIRED drops ca-1.
LEGACY_BACKEND = "    - {name: %s, type: builtin, dpCert: {rotation: {expiration: 1h}}}\n"
ROTATED = (
    "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: ca-2\n  secondaryBackends: [ca-1]\n  backends:\n"
    + LEGACY_BACKEND % "ca-1"
    + LEGACY_BACKEND % "ca-2"
)
RETIRED = "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: ca-2\n  backends:\n" + LEGACY_BACKEND % "ca-2"


def dataplane(name, workload):
    return f"type: Dataplane\nmesh: default\nname: {name}\nlabels:\n  kuma.io/workload: {workload}\n"


def service_dataplane(name, service):
    """A Dataplane whose legacy identity is spiffe://default/<service>."""
    return (
        f"type: Dataplane\nmesh: default\nname: {name}\nnetworking:\n  address: 10.0.0.1\n"
        f"  inbound: [{{port: 8080, tags: {{kuma.io/service: {service}}}}}]\n"
    )


def registration(name, dataplane_name, *selectors):
    return (
        f"type: WorkloadRegistration\nmesh: default\nname: {name}\nspec:\n  dataplane: {dataplane_name}\n"
        f"  selectors: [{', '.join(selectors)}]\n"
    )


def two_workloads():
    """Dataplanes a, b and c of the MeshIdentity, a for uid 10001 and b for uid 10002 (c: nobody yet)."""
    return {
        "identity.yaml": MESH_IDENTITY,
        "dataplanes.yaml": "---\n".join(dataplane(n, n) for n in ("a", "b", "c")),
        "reg-a.yaml": registration("a", "a", f"unix:uid:{UID_A}"),
        "reg-b.yaml": registration("b", "b", f"unix:uid:{UID_B}"),
    }


@pytest.fixture(scope="session")
def runtime():
    built = build_runtime()
    yield built
    shutil.rmtree(built.root, ignore_errors=True)


@pytest.fixture
def spawn(runtime, workload_dir):
    started = []

    def run(uid, mode, *args, groups=()):
        started.append(Workload(runtime, workload_dir / "workload.sock", uid, groups, mode, *args))
        return started[-1]

    yield run
    for w in started:
        w.close()


# --- checks ---------------------------------------------------------------------------------------------------


def certs(ders):
    return [x509.load_der_x509_certificate(base64.b64decode(d)) for d in ders]


def public_bytes(key):
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def issuing_ca(chain, roots):
    """The CA among `roots` that `chain` (leaf first) verifies against, signature by signature; else None."""
    for child, parent in zip(chain, chain[1:]):
        child.verify_directly_issued_by(parent)
    for root in roots:
        if root.subject == chain[-1].issuer:
            try:
                chain[-1].verify_directly_issued_by(root)
                return root
            except (InvalidSignature, ValueError, TypeError):
                continue
    return None


def check_svid(svid, bundles, expected_id):
    """Checks an SVID as py-spiffe does not (the key, the signatures, the validity); returns its CA."""
    assert svid["spiffe_id"] == expected_id
    chain = certs(svid["chain"])
    leaf = chain[0]
    key = serialization.load_der_private_key(base64.b64decode(svid["key"]), None)
    assert public_bytes(key.public_key()) == public_bytes(leaf.public_key()), "the key is not the leaf's"
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(u) for u in san.get_values_for_type(x509.UniformResourceIdentifier)] == [expected_id]
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    now = datetime.datetime.now(datetime.timezone.utc)
    assert leaf.not_valid_before_utc <= now < leaf.not_valid_after_utc
    trust_domain = expected_id.removeprefix("spiffe://").split("/")[0]
    ca = issuing_ca(chain, certs(bundles.get(trust_domain, [])))
    assert ca is not None, f"{expected_id}'s chain does not verify against its bundle {sorted(bundles)}"
    return ca


def own_context(workload, expected_id):
    ctx = workload.next()
    assert "error" not in ctx, ctx
    assert len(ctx["svids"]) == 1, [s["spiffe_id"] for s in ctx["svids"]]
    check_svid(ctx["svids"][0], ctx["bundles"], expected_id)
    return ctx


def make_ca(common_name):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    usage = dict.fromkeys(
        ["digital_signature", "content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
         "encipher_only", "decipher_only"], False,
    )  # fmt: skip
    return (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(key_cert_sign=True, crl_sign=True, **usage), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip


def mesh_trust(trust_domain, ca):
    pem = ca.public_bytes(serialization.Encoding.PEM).decode()
    return (
        f"type: MeshTrust\nname: other\nmesh: default\nspec:\n  trustDomain: {trust_domain}\n"
        "  caBundles:\n    - type: Pem\n      pem:\n        value: |\n"
        + "".join(f"          {line}\n" for line in pem.splitlines())
    )


# --- the tests ------------------------------------------------------------------------------------------------


def test_each_workload_gets_exactly_its_own_svid(workload_daemon, spawn):
    # A registration matches only a caller with all of its selectors: uid 10001 lacks this gid.
    decoy = registration("decoy", "c", f"unix:uid:{UID_A}", "unix:gid:4242")
    workload_daemon({**two_workloads(), "decoy.yaml": decoy})
    a, b = spawn(UID_A, "context"), spawn(UID_B, "context")
    got_a, got_b = own_context(a, ID_A), own_context(b, ID_B)
    assert got_a["svids"][0]["key"] != got_b["svids"][0]["key"]


def test_registrations_select_by_what_the_kernel_says_of_the_process(workload_daemon, spawn, runtime):
    binary = Path(runtime.python)
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()
    mine, other = f"unix:uid:{UID_A}", f"unix:uid:{UID_B}"
    registrations = [
        registration("by-group", "a", "unix:supplementary_gid:5555"),
        registration("by-path", "b", mine, f"unix:path:{binary}"),
        registration("by-sha256", "c", mine, f"unix:sha256:{digest}"),
        registration("other-binary", "a", mine, "unix:path:/usr/bin/true"),
        registration("other-uid", "b", other, f"unix:path:{binary}"),
    ]
    resources = {**two_workloads(), "reg-a.yaml": "---\n".join(registrations)}
    del resources["reg-b.yaml"]
    workload_daemon(resources)
    # Every registration it matches, in name order; the first is the default identity.
    assert spawn(UID_A, "svids", groups=[7, 5555]).next() == {"spiffe_ids": [ID_A, ID_B, ID_C]}
    assert spawn(UID_A, "svids").next() == {"spiffe_ids": [ID_B, ID_C]}


def test_two_workloads_talk_mtls_with_spiffe_tls(workload_daemon, spawn):
    workload_daemon(two_workloads())
    server = spawn(UID_A, "serve", ID_B)
    port = server.next()["port"]
    client = spawn(UID_B, "dial", port, ID_A)
    assert client.next() == {"received": f"pong from {ID_A}"}
    assert server.next() == {"received": f"ping from {ID_B}"}


def test_a_mesh_trust_and_another_mesh_arrive_as_federated_bundles(workload_daemon, spawn):
    ca = make_ca("other.example CA")
    other_mesh = "type: Mesh\nname: billing\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: ca-1\n  backends:\n" + LEGACY_BACKEND % "ca-1"
    workload_daemon({**two_workloads(), "trust.yaml": mesh_trust("other.example", ca), "billing.yaml": other_mesh})
    ctx = own_context(spawn(UID_A, "context", "other.example", "billing"), ID_A)
    assert certs(ctx["lookup"]["other.example"]) == [ca]
    assert ca not in certs(ctx["bundles"][TRUST_DOMAIN])
    # Every mesh's CA (what SDS's ALL holds), under its own trust domain.
    (billing_ca,) = certs(ctx["lookup"]["billing"])
    assert "meshca billing/ca-1" in billing_ca.subject.rfc4514_string()


def test_a_watch_sees_a_mesh_trust_come_and_go(workload_daemon, spawn):
    daemon = workload_daemon(two_workloads())
    watch = spawn(UID_A, "watch")
    assert "other.example" not in watch.next()["bundles"]
    ca = make_ca("other.example CA")
    daemon.write_resource("trust.yaml", mesh_trust("other.example", ca))
    added = watch.until("the federated bundle", lambda u: "error" in u or "other.example" in u["bundles"])
    daemon.remove_resource("trust.yaml")
    # Each message is the whole state: a bundle left out of the next one is gone.
    removed = watch.until("no federated bundle", lambda u: "error" in u or "other.example" not in u["bundles"])
    assert certs(added[-1]["bundles"]["other.example"]) == [ca]
    for update in added + removed:
        assert "error" not in update, update
        check_svid(update["svids"][0], update["bundles"], ID_A)


def test_an_unregistered_workload_is_denied_until_registered(workload_daemon, spawn):
    daemon = workload_daemon(two_workloads())
    denied = spawn(UID_C, "context").next()
    assert denied["error"] == "FetchX509SvidError" and "PERMISSION_DENIED" in denied["message"], denied
    # An X509Source retries the denial on its own; the registration arrives while it waits.
    source = spawn(UID_C, "source", 60)
    assert source.next() == {"event": "starting"}
    daemon.write_resource("reg-c.yaml", registration("c", "c", f"unix:uid:{UID_C}"))
    own_context(source, ID_C)
    # And a client started after the change is served at once.
    own_context(spawn(UID_C, "context"), ID_C)


def issuer_in_own_bundle(ctx):
    """The CA, from the update's own bundle, that its SVID verifies against (the check fails without one)."""
    (svid,) = ctx["svids"]
    return check_svid(svid, ctx["bundles"], ID_WEB)


def test_a_watch_trusts_a_new_ca_before_its_svid_comes_from_it(workload_daemon, spawn):
    daemon = workload_daemon(
        {"web.yaml": service_dataplane("web-1", "web"), "reg.yaml": registration("web", "web-1", f"unix:uid:{UID_A}")}
    )
    watch = spawn(UID_A, "watch")
    updates = [watch.next()]
    old_ca = issuer_in_own_bundle(updates[0])
    daemon.write_resource("mesh.yaml", ROTATED)
    updates += watch.until("an SVID from the new CA", lambda u: "error" in u or issuer_in_own_bundle(u) != old_ca)
    daemon.write_resource("mesh.yaml", RETIRED)
    updates += watch.until("a bundle without the old CA", lambda u: "error" in u or old_ca not in bundle_of(u))
    assert not [u for u in updates if "error" in u], updates
    issuers = [issuer_in_own_bundle(u) for u in updates]  # each verifies against its own update's bundle
    new_ca = issuers[-1]
    first_trusted = next(i for i, u in enumerate(updates) if new_ca in bundle_of(u))
    first_issued = issuers.index(new_ca)
    assert first_trusted < first_issued, f"the new CA was trusted in update {first_trusted}, issued in {first_issued}"
    assert bundle_of(updates[-1]) == [new_ca]


def bundle_of(update):
    return certs(update["bundles"]["default"])


def test_a_watch_follows_its_registration_to_another_dataplane(workload_daemon, spawn):
    daemon = workload_daemon(two_workloads())
    watch = spawn(UID_A, "watch")
    own_context(watch, ID_A)
    daemon.write_resource("reg-a.yaml", registration("a", "c", f"unix:uid:{UID_A}"))
    own_context(watch, ID_C)


def test_a_watch_outlives_a_restart_of_the_daemon(workload_daemon, spawn):
    daemon = workload_daemon(two_workloads())
    watch = spawn(UID_A, "watch")
    own_context(watch, ID_A)
    daemon.stop()
    assert daemon.proc.returncode == 0, daemon.log_text()
    daemon.start()  # on the socket file the last run left
    own_context(watch, ID_A)


def test_removing_a_registration_ends_its_streams_with_permission_denied(workload_daemon, spawn):
    daemon = workload_daemon(two_workloads())
    a, b = spawn(UID_A, "raw"), spawn(UID_B, "raw")
    assert a.next() == {"svids": [ID_A]}
    assert b.next() == {"svids": [ID_B]}
    daemon.remove_resource("reg-a.yaml")
    ended = a.next()
    assert ended["status"] == "PERMISSION_DENIED", ended
    assert spawn(UID_A, "raw").next()["status"] == "PERMISSION_DENIED"
    # The other workload's stream goes on: a new federated bundle reaches it.
    daemon.write_resource("trust.yaml", mesh_trust("other.example", make_ca("other.example CA")))
    assert b.next() == {"svids": [ID_B]}


def raw_calls(stub):
    """Each Workload API method, called with `metadata`, answering its first message or raising its status."""
    return {
        "FetchX509SVID": lambda md: next(stub.FetchX509SVID(workload_pb2.X509SVIDRequest(), metadata=md)),
        "FetchX509Bundles": lambda md: next(stub.FetchX509Bundles(workload_pb2.X509BundlesRequest(), metadata=md)),
        "FetchJWTSVID": lambda md: stub.FetchJWTSVID(workload_pb2.JWTSVIDRequest(audience=["x"]), metadata=md),
        "FetchJWTBundles": lambda md: next(stub.FetchJWTBundles(workload_pb2.JWTBundlesRequest(), metadata=md)),
        "ValidateJWTSVID": lambda md: stub.ValidateJWTSVID(
            workload_pb2.ValidateJWTSVIDRequest(audience="x", svid="e30.e30.e30"), metadata=md
        ),
    }


def status_of(call, metadata):
    with pytest.raises(grpc.RpcError) as raised:
        call(metadata)
    return raised.value.code()


def test_raw_calls_need_the_security_header(workload_daemon, workload_dir):
    me = f"spiffe://{TRUST_DOMAIN}/workload/me"
    workload_daemon(
        {
            "identity.yaml": MESH_IDENTITY,
            "me.yaml": dataplane("me", "me") + "---\n" + registration("me", "me", f"unix:uid:{os.geteuid()}"),
        }
    )
    with grpc.insecure_channel(f"unix://{workload_dir / 'workload.sock'}") as channel:
        stub = workload_pb2_grpc.SpiffeWorkloadAPIStub(channel)
        calls = raw_calls(stub)
        for method, call in calls.items():
            assert status_of(call, ()) == grpc.StatusCode.INVALID_ARGUMENT, method
            assert status_of(call, (("workload.spiffe.io", "false"),)) == grpc.StatusCode.INVALID_ARGUMENT, method
        svids = calls["FetchX509SVID"](HEADER).svids
        assert [s.spiffe_id for s in svids] == [me]
        # The mesh trusts its legacy CA (trust domain "default") beside the MeshIdentity's.
        assert sorted(calls["FetchX509Bundles"](HEADER).bundles) == ["spiffe://default", f"spiffe://{TRUST_DOMAIN}"]
        for method in ("FetchWITSVID", "FetchWITBundles"):
            wit = channel.unary_stream(f"/SpiffeWorkloadAPI/{method}", lambda _: b"", lambda b: b)
            assert status_of(lambda md: next(wit(b"", metadata=md)), ()) == grpc.StatusCode.INVALID_ARGUMENT
            assert status_of(lambda md: next(wit(b"", metadata=md)), HEADER) == grpc.StatusCode.UNIMPLEMENTED


def test_the_socket_is_open_to_every_user_and_logged(workload_daemon, workload_dir):
    daemon = workload_daemon(two_workloads())
    socket = workload_dir / "workload.sock"
    assert stat.S_ISSOCK(socket.stat().st_mode)
    assert stat.S_IMODE(socket.stat().st_mode) == 0o666
    lines = [line for line in daemon.log_text().splitlines() if "Workload API listening" in line]
    assert any(str(socket) in line for line in lines), lines


def fetch_jwt(spawn, uid, audience):
    got = spawn(uid, "jwt", audience).next()
    assert "error" not in got, got
    return got


def test_a_jwt_svid_validates_against_the_jwt_bundles(workload_daemon, spawn):
    resources = two_workloads()
    resources["reg-a.yaml"] += "  jwtSvid:\n    expiry: 2m\n"
    workload_daemon(resources)
    got = fetch_jwt(spawn, UID_A, ID_B)
    assert got["spiffe_id"] == got["parsed_id"] == ID_A
    assert got["audience"] == [ID_B]
    assert time.time() < got["expiry"] <= time.time() + 120 + 5


def test_validate_jwt_svid_accepts_a_peers_token_for_its_audience_only(workload_daemon, spawn):
    workload_daemon(two_workloads())
    token = fetch_jwt(spawn, UID_A, ID_B)["token"]
    assert spawn(UID_B, "validate", token, ID_B).next() == {"spiffe_id": ID_A}
    # py-spiffe checks the audience itself, but never a signature: a forged token is the server's to refuse.
    header, claims, signature = token.split(".")
    forged = ".".join([header, claims, signature[:10] + ("B" if signature[10] == "A" else "A") + signature[11:]])
    for bad, audience in ((token, "spiffe://example.org/other"), (forged, ID_B)):
        refused = spawn(UID_B, "validate", bad, audience).next()
        assert refused.get("error") == "ValidateJwtSvidError", refused
        assert "INVALID_ARGUMENT" in refused["message"], refused
